"""Serving benchmark: the whole workload sent at once to cbserve, streamed back.

    python -m bench.throughput                         # own stack, float32 and bfloat16
    python -m bench.throughput --dtype float32 --out out/bench.json
    python -m bench.throughput --server localhost:50051   # a stack that is already running

Without --server it starts its own scheduler and worker (cbserve.local_stack) once
per dtype, so each dtype is measured on a fresh stack. The workload is
bench.workload's: prompt lengths uniform 16..128, output lengths uniform 16..256,
EOS ignored; every request carries its own seed, so temperature 1 is reproducible.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from bench.report import RequestTiming, markdown_table, summarize, write_json
from bench.workload import BenchRequest, describe, make_workload
from cbserve.client import AsyncClient
from cbserve.local_stack import LocalStack
from cbserve.v1 import generation_pb2 as pb

DTYPES = ("float32", "bfloat16")


async def _stream_one(client: AsyncClient, request: BenchRequest, temperature: float):
    timing = RequestTiming(prompt_tokens=request.prompt_len, sent_at=time.perf_counter())
    async for response in client.generate(
        token_ids=request.prompt_token_ids,
        max_tokens=request.max_tokens,
        ignore_eos=True,
        temperature=temperature,
        seed=request.seed,
    ):
        if response.token_ids:
            timing.chunks.append((time.perf_counter(), len(response.token_ids)))
        if response.finish_reason:
            timing.finish_reason = pb.FinishReason.Name(response.finish_reason)
    return timing


async def run_workload(address: str, requests: list[BenchRequest], temperature: float) -> dict:
    async with AsyncClient(address) as client:
        info = await client.model_info()
        # One short request first: the first step pays one-time costs that are no
        # part of serving (allocator growth, lazy imports, thread pools).
        await client.complete(token_ids=requests[0].prompt_token_ids, max_tokens=4, temperature=0)
        started = time.perf_counter()
        timings = await asyncio.gather(*(_stream_one(client, r, temperature) for r in requests))
        wall = time.perf_counter() - started
    short = [
        (r.index, t.output_tokens, r.max_tokens)
        for r, t in zip(requests, timings, strict=True)
        if t.output_tokens != r.max_tokens
    ]
    if short:
        print(f"warning: (request, got, asked) output lengths differ: {short}", file=sys.stderr)
    summary = summarize(timings, wall)
    summary["model"] = info.model_name
    summary["num_workers"] = info.num_workers
    summary["kv_capacity_tokens"] = info.kv_capacity_tokens
    return summary


def _stack_args(args: argparse.Namespace, dtype: str) -> tuple[list[str], list[str]]:
    worker = ["--dtype", dtype]
    if args.num_kv_blocks is not None:
        worker += ["--num-kv-blocks", str(args.num_kv_blocks)]
    scheduler = []
    if args.max_num_seqs is not None:
        scheduler += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_num_batched_tokens is not None:
        scheduler += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return worker, scheduler


def benchmark(args: argparse.Namespace, requests: list[BenchRequest]) -> dict[str, dict]:
    if args.server:
        return {"server": asyncio.run(run_workload(args.server, requests, args.temperature))}
    runs = {}
    for dtype in args.dtypes:
        worker_args, scheduler_args = _stack_args(args, dtype)
        print(f"starting a local stack with --dtype {dtype} ...", file=sys.stderr, flush=True)
        with LocalStack(worker_args=worker_args, scheduler_args=scheduler_args) as stack:
            runs[dtype] = asyncio.run(run_workload(stack.address, requests, args.temperature))
        runs[dtype]["dtype"] = dtype
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--server", default=None, metavar="HOST:PORT", help="use this stack")
    parser.add_argument(
        "--dtype", action="append", choices=DTYPES, help="repeatable; default: both"
    )
    parser.add_argument("--dtypes", default=None, help="comma-separated, e.g. float32,bfloat16")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--tokenizer", type=Path, default=None, help="HF dir for the prompts")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)
    chosen = list(args.dtype or [])
    if args.dtypes:
        chosen += [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = sorted(set(chosen) - set(DTYPES))
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; choose from {DTYPES}")
    if args.server and chosen:
        parser.error("--dtype applies to the stack this benchmark starts, not to --server")
    args.dtypes = list(dict.fromkeys(chosen)) or list(DTYPES)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = make_workload(args.num_prompts, args.seed, args.tokenizer)
    workload = describe(requests, args.seed)
    print(
        f"workload: {workload['num_prompts']} requests, {workload['total_prompt_tokens']} prompt "
        f"and {workload['total_output_tokens']} output tokens, seed {args.seed}, "
        f"temperature {args.temperature}",
        file=sys.stderr,
    )
    runs = benchmark(args, requests)
    print(markdown_table(runs))
    if args.out:
        payload = {
            "benchmark": "cbserve",
            "command": " ".join(["python -m bench.throughput", *(argv or sys.argv[1:])]),
            "workload": {**workload, "temperature": args.temperature},
            "runs": runs,
        }
        write_json(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
