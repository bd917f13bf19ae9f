"""Times one layer's decode attention: the torch path against the C kernel.

    .venv/bin/python -m bench.micro.attention_profile [--batch 64] [--context 200 | 100:1500]
        [--heads 9] [--kv-heads 3] [--head-dim 64] [--block-size 16] [--threads 2]
        [--kv-cache-dtype float32|float16|bfloat16]

Random K/V in a pool of scattered blocks, `batch` decode queries with context lengths
drawn from `--context`; the defaults are SmolLM2-135M's attention shapes. Prints the
median time per layer of each path and the largest difference between their outputs.
Multiply by the model's layers (30) for a step's attention. `--kv-cache-dtype` is the
pool's, as the worker's flag (the C kernel reads float32 and float16 pools).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from bench.harness.workload import parse_range
from worker_svc.attention import BatchLayout, CpuAttentionBackend, TorchAttentionBackend
from worker_svc.attention.cpu_backend import kernel_cache_unsupported_reason
from worker_svc.kv_pool import KV_CACHE_TORCH_DTYPES, KVPool, KVPoolSpec


def main(
    argv: list[str] | None = None, prog: str = "python -m bench.micro.attention_profile"
) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", default="200", metavar="N|LOW:HIGH")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-dtype", default="float32", choices=KV_CACHE_TORCH_DTYPES)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    low, high = parse_range(args.context)
    lens = [rng.randint(low, high) for _ in range(args.batch)]
    bs = args.block_size
    needed = [-(-n // bs) for n in lens]
    # Twice the blocks needed, shuffled: sequences' blocks are scattered, as in a busy pool.
    kv_dtype = KV_CACHE_TORCH_DTYPES[args.kv_cache_dtype]
    spec = KVPoolSpec(1, args.kv_heads, args.head_dim, bs, kv_dtype)
    pool = KVPool(spec, 2 * sum(needed))
    pool.cache.normal_()
    free = list(range(pool.num_blocks))
    rng.shuffle(free)
    tables = tuple(tuple(free.pop() for _ in range(n)) for n in needed)
    layout = BatchLayout((1,) * args.batch, tuple(lens), tables, bs)
    query = torch.randn(args.batch, args.heads, args.head_dim)
    key = torch.randn(args.batch, args.kv_heads, args.head_dim)
    value = torch.randn(args.batch, args.kv_heads, args.head_dim)
    scale = args.head_dim**-0.5

    outputs = {}
    backends = [TorchAttentionBackend()]
    if kernel_cache_unsupported_reason(kv_dtype) is None:
        backends.append(CpuAttentionBackend())
    for backend in backends:
        metadata = backend.build_metadata(layout, torch.device("cpu"))

        def layer(backend=backend, metadata=metadata) -> torch.Tensor:
            return backend.forward(0, query, key, value, pool, metadata, scale)

        outputs[backend.name] = layer()
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            layer()
            times.append(time.perf_counter() - started)
        print(
            f"{backend.name:6s} {args.kv_cache_dtype} pool, batch={args.batch} "
            f"context={low}..{high} "
            f"(mean {statistics.mean(lens):.0f}): {statistics.median(times) * 1000:8.2f} ms/layer"
        )
    if "cpu" in outputs:
        difference = (outputs["torch"] - outputs["cpu"]).abs().max().item()
        print(f"largest difference between the two: {difference:.2e}")


if __name__ == "__main__":
    main()
