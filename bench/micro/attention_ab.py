"""Two builds of the paged-decode kernel, called in turn in one process.

    .venv/bin/python -m bench.micro.attention_ab OLD.so NEW.so [--threads 2] [--calls 20]

A kernel change is measured against the build before it (both are in the kernel cache,
~/.cache/cbserve/kernels/paged_decode-*.so; `load_kernel()._name` names the current
one) on one layer of SmolLM2's attention: 64 decodes with contexts 100-800, blocks
scattered over a pool twice their size. Calls alternate, so a busy machine slows both
alike. A build with `paged_decode_attention_f16` is also timed over a float16 pool.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import time

import torch

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
ENTRY_POINTS = ("paged_decode_attention", "paged_decode_attention_f16")


def load(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    for name in ENTRY_POINTS:
        if hasattr(lib, name):
            function = getattr(lib, name)
            function.restype = ctypes.c_int
            function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
    return lib


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.attention_ab") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    lens = [rng.randint(100, 800) for _ in range(args.batch)]
    needed = [-(-n // BLOCK) for n in lens]
    num_blocks, max_blocks = 2 * sum(needed), max(needed)
    k = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    v = torch.randn_like(k)
    q = torch.randn(args.batch, HEADS, HEAD_DIM)
    free = list(range(num_blocks))
    rng.shuffle(free)
    rows = [[free.pop() for _ in range(n)] + [0] * (max_blocks - n) for n in needed]
    tables = torch.tensor(rows, dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)

    def call(function, k_cache, v_cache) -> None:
        out = torch.empty_like(q)
        function(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                 context_lens.data_ptr(), out.data_ptr(), args.batch, HEADS, KV_HEADS,
                 HEAD_DIM, BLOCK, max_blocks, HEAD_DIM**-0.5)  # fmt: skip

    old, new = load(args.old), load(args.new)
    cases = {
        "old, float32 pool": (old.paged_decode_attention, k, v),
        "new, float32 pool": (new.paged_decode_attention, k, v),
    }
    if hasattr(new, "paged_decode_attention_f16"):
        cases["new, float16 pool"] = (new.paged_decode_attention_f16, k.half(), v.half())
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.calls):
        for name, (function, k_cache, v_cache) in cases.items():
            started = time.perf_counter()
            call(function, k_cache, v_cache)
            times[name].append(time.perf_counter() - started)
    base = statistics.median(times["old, float32 pool"])
    print(f"{args.threads} threads, {args.batch} decodes, contexts 100-800, one layer")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(
            f"{name:18s} median {median * 1e3:6.2f} ms  min {min(samples) * 1e3:6.2f} ms"
            f"  ({base / median:.2f}x the old)"
        )


if __name__ == "__main__":
    main()
