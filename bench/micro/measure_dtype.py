"""Measures float32 against bfloat16 for the worker's two typical steps, in-process.

    .venv/bin/python -m bench.micro.measure_dtype [--threads 2] [--batch 64] [--context 200]
        [--prefill 512] [--steps 5]

- decode: one step of `batch` sequences, each with `context` tokens of KV;
- prefill: one step computing a `prefill`-token prompt from scratch.

Measured 2026-11-21 on the development machine (2 vCPUs "AMD EPYC", torch 2.13.0
CPU, --threads 2, default model). Its /proc/cpuinfo lists avx2/fma but neither
amx nor avx512_bf16, so bfloat16 matmuls have no fast kernel here:

    idle machine     float32   decode 64 x ctx 200:   326 ms/step   prefill 512:   938 ms
                     bfloat16  decode 64 x ctx 200:  8330 ms/step   prefill 512:  5987 ms
    loaded machine   float32   decode 64 x ctx 200:  1708 ms/step   prefill 512:  3344 ms
    (load ~5)        bfloat16  decode 64 x ctx 200: 10769 ms/step   prefill 512: 25433 ms

float32 is 6-25x faster, so `--dtype auto` never takes bfloat16 on such a CPU (see
worker_svc/compute/paths.py and bench/micro/kernels.py for the int8 path); float32 is also
the dtype the greedy-equality tests against transformers' `generate` run in.
On a CPU with AMX / avx512_bf16, or on CUDA, run this again before changing it,
and run the model tests with CBSERVE_WORKER_TEST_DTYPE=bfloat16.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path
from worker_svc.attention import select_backend
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.kv_pool import kv_cache_dtype as kv_cache_dtype_of
from worker_svc.model_loader import load_model
from worker_svc.model_runner import ModelRunner

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def make_runner(
    dtype: torch.dtype | str,
    num_blocks: int,
    block_size: int = 16,
    attention: str = "auto",
    compile: bool = False,
    kv_cache_dtype: str = "auto",
    model: str | None = None,
) -> ModelRunner:
    """A runner with the attention backend a worker would pick (`attention`, as the
    worker's --attention-backend); `compile`, `kv_cache_dtype` and `model` (default: the
    default model) as the worker's --compile, --kv-cache-dtype and --model."""
    device = torch.device("cpu")
    loaded = load_model(model or default_model_path(), dtype, device, compile=compile)
    kv_dtype = kv_cache_dtype_of(kv_cache_dtype, loaded.dtype, loaded.compute_path)
    spec = KVPoolSpec(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, block_size, kv_dtype)
    backend, _ = select_backend(
        attention, device, loaded.dtype, block_size, loaded.head_dim, kv_dtype
    )
    return ModelRunner(loaded, KVPool(spec, num_blocks), backend)


def new_sequence(seq_id: int, tokens: list[int], blocks: list[int]) -> pb.NewSequence:
    return pb.NewSequence(
        seq_id=seq_id,
        prompt_token_ids=tokens,
        num_scheduled_tokens=len(tokens),
        block_ids=blocks,
        sampling=GREEDY,
    )


def measure_decode(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    rng = random.Random(0)
    bs = runner.pool.block_size
    per_seq = -(-(context + steps + 3) // bs)
    blocks = list(range(batch * per_seq))
    rng.shuffle(blocks)
    seqs = {}
    # Prefill in groups of 8 so that the setup itself stays small.
    for start in range(0, batch, 8):
        plan = pb.StepPlan(step_id=start)
        for sid in range(start, min(start + 8, batch)):
            tokens = [rng.randrange(100, 40000) for _ in range(context - 1)]
            seqs[sid] = blocks[sid * per_seq : (sid + 1) * per_seq]
            plan.new_sequences.append(new_sequence(sid, tokens, seqs[sid]))
        runner.execute(plan)
    decode = pb.StepPlan(
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=sid, num_scheduled_tokens=1) for sid in seqs
        ]
    )
    times = []
    for step in range(steps + 2):
        started = time.perf_counter()
        runner.execute(decode)
        if step >= 2:  # the first steps warm up allocators and kernels
            times.append(time.perf_counter() - started)
    runner.reset()
    return statistics.median(times)


def measure_prefill(runner: ModelRunner, length: int, repeats: int) -> float:
    rng = random.Random(1)
    tokens = [rng.randrange(100, 40000) for _ in range(length)]
    blocks = list(range(-(-length // runner.pool.block_size)))
    times = []
    for attempt in range(repeats + 1):
        runner.reset()
        started = time.perf_counter()
        runner.execute(pb.StepPlan(new_sequences=[new_sequence(1, tokens, blocks)]))
        if attempt:
            times.append(time.perf_counter() - started)
    runner.reset()
    return statistics.median(times)


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.measure_dtype") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    per_seq = -(-(args.context + args.steps + 3) // 16)
    num_blocks = max(args.batch * per_seq, -(-args.prefill // 16))
    for name in args.dtypes:
        runner = make_runner(getattr(torch, name), num_blocks)
        decode = measure_decode(runner, args.batch, args.context, args.steps)
        prefill = measure_prefill(runner, args.prefill, repeats=3)
        print(
            f"{name:9s} decode batch={args.batch} ctx={args.context}: {decode * 1000:7.1f} ms/step"
            f"   prefill {args.prefill} tokens: {prefill * 1000:7.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
