"""Decode step time of several compute paths, interleaved in one process, so that a
busy machine slows them alike: A B C A B C ..., min and median per path.

    .venv/bin/python -m bench.micro.step_compare [--dtypes float32,int8,q4_1] [--batches 1,64]
        [--context 200] [--steps 15] [--threads 2]

Each path gets its own runner with `batch` sequences prefilled to `context` tokens
(bench/micro/step_profile.py's set-up, same random tokens for every path); a timed step is
one decode token for every sequence (runner.execute of one step plan), the forward,
attention and sampling included, as bench/micro/step_profile.py times it. The CPU, its
load average at the start and the end are printed beside the figures.

`q4_1@FILE` is the q4_1 path on another model file (a GGUF of other block formats, such
as a Q4_K_M file made by llama-quantize): `--dtypes q4_1,q4_1@/tmp/q4_k_m.gguf` compares
the shipped file with it.

`q4_1-python` is the q4_1 path with its native decode step off (CBSERVE_NATIVE_DECODE=0,
models/qblock/native.py): `--dtypes q4_1,q4_1-python` compares the two. `q4_1+kv16` is
the q4_1 path over a float16 KV pool (--kv-cache-dtype float16; bench/micro/kv_suffix.py):
`--dtypes q4_1,q4_1+kv16` compares the pools; `q4_1+kv16-python` combines both.
`q4_1-act8=qkv/gate_up` is the q4_1 path with 8-bit activation blocks on those projection
kinds (CBSERVE_QBLOCK_ACT8, compute/qblock_vnni8.py): `--dtypes q4_1,q4_1-act8=qkv/gate_up`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.micro.kv_suffix import split_kv_suffix
from bench.micro.measure_dtype import make_runner
from bench.micro.step_profile import set_up, step_plan
from worker_svc.compute.cpu_features import cpu_name


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.step_compare") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,int8,q4_1")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",")
    print(
        f"CPU: {cpu_name()}, {args.threads} threads, torch {torch.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for batch in (int(b) for b in args.batches.split(",")):
        contexts = [args.context] * batch
        blocks = sum(-(-(c + 64) // 16) for c in contexts) + 2
        runners = {}
        for name in dtypes:
            runner = load_runner(name, blocks)
            runners[name] = (runner, set_up(runner, contexts, seed=0))
        times: dict[str, list[float]] = {name: [] for name in dtypes}
        for step in range(args.steps + 2):
            for name, (runner, free) in runners.items():
                started = time.perf_counter()
                runner.execute(step_plan(batch, [], free, runner.pool.block_size))
                if step >= 2:  # two warm-up steps
                    times[name].append(time.perf_counter() - started)
        for name, samples in times.items():
            median = statistics.median(samples)
            print(
                f"batch {batch:3d} {name:12s} {median * 1e3:7.1f} ms/step median "
                f"(min {min(samples) * 1e3:6.1f}), {batch / median:6.0f} tok/s median "
                f"(best {batch / min(samples):6.0f})"
            )
        del runners
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def load_runner(name: str, blocks: int):
    """`name` is a dtype, then maybe a KV suffix (`+kv16`), then maybe `-python`: its
    native decode step off, then maybe `-act8=KINDS`: the projection kinds (joined by
    `/`) that take 8-bit activation blocks (CBSERVE_QBLOCK_ACT8, compute/qblock_vnni8.py),
    then maybe `@FILE`: the model file."""
    name, _, model = name.partition("@")
    name, _, act8 = name.partition("-act8=")
    dtype, python_only = name.removesuffix("-python"), name.endswith("-python")
    dtype, kv_cache_dtype = split_kv_suffix(dtype)
    env = {"CBSERVE_NATIVE_DECODE": "0" if python_only else None}
    env["CBSERVE_QBLOCK_ACT8"] = act8.replace("/", ",")
    saved = {key: os.environ.get(key) for key in env}
    for key, value in env.items():
        if value is not None:
            os.environ[key] = value
    try:
        return make_runner(dtype, blocks, kv_cache_dtype=kv_cache_dtype, model=model or None)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


if __name__ == "__main__":
    main()
