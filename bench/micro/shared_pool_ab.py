"""A decode step's attention over the private KV pool against the shared one (issue 46).

    .venv/bin/python -m bench.micro.shared_pool_ab [--pool-mib 1024] [--threads 2]
        [--batch 64] [--steps 15]

--kv-pool-shared puts the CPU pool in a memfd (worker_svc/shared_kv_memory.py) so that
KV moves to a worker on this host in one copy; shmem gets 2 MiB pages only where
/sys/kernel/mm/transparent_hugepage/shmem_enabled allows it, the private pool gets them
on the usual "madvise" setting. This times what that costs: SmolLM2-135M's decode
attention (30 layers, 9 heads, 3 KV heads, head_dim 64, float16 pool) through the C
kernel, `batch` decodes with contexts 100-800 whose blocks are scattered over the whole
pool, the two pools called in turn so that a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from worker_svc.attention.cpu_kernel import paged_decode_attention
from worker_svc.kv_pool import KVPool, KVPoolSpec

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16


def step_seconds(pool: KVPool, query, tables, context_lens) -> float:
    started = time.perf_counter()
    for layer in range(LAYERS):
        k, v = pool.layer(layer)
        paged_decode_attention(query, k, v, tables, context_lens, HEAD_DIM**-0.5)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-mib", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = KVPoolSpec(LAYERS, KV_HEADS, HEAD_DIM, BLOCK, torch.float16)
    num_blocks = args.pool_mib * 2**20 // spec.bytes_per_block
    pools = {"private": KVPool(spec, num_blocks), "shared": KVPool(spec, num_blocks, shared=True)}
    for pool in pools.values():
        for layer in range(LAYERS):  # random K/V: zeros could take shortcuts nowhere, but
            pool.cache[layer].normal_()  # a real pool holds values, not zero pages
    rng = random.Random(0)
    lens = [rng.randint(100, 800) for _ in range(args.batch)]
    needed = [-(-n // BLOCK) for n in lens]
    if sum(needed) > num_blocks:
        raise SystemExit(f"a pool of {num_blocks} blocks is too small for {sum(needed)}")
    chosen = rng.sample(range(num_blocks), sum(needed))
    rows, at = [], 0
    for n in needed:
        rows.append(chosen[at : at + n] + [0] * (max(needed) - n))
        at += n
    tables = torch.tensor(rows, dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    query = torch.randn(args.batch, HEADS, HEAD_DIM)
    times: dict[str, list[float]] = {name: [] for name in pools}
    for step in range(args.steps + 1):
        for name, pool in pools.items():
            seconds = step_seconds(pool, query, tables, context_lens)
            if step:  # the first warms caches
                times[name].append(seconds)
    print(
        f"{args.threads} threads, {args.batch} decodes (contexts 100-800), {LAYERS} layers, "
        f"float16 pool of {num_blocks} blocks ({args.pool_mib} MiB), {args.steps} steps"
    )
    base = statistics.median(times["private"])
    for name, pool in pools.items():
        median = statistics.median(times[name])
        print(
            f"  {name:8s} huge pages {str(pool.huge_pages):5s} median {median * 1e3:7.2f} ms"
            f"  min {min(times[name]) * 1e3:7.2f} ms  ({median / base:.2f}x the private)"
        )


if __name__ == "__main__":
    main()
