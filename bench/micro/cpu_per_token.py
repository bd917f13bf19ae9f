"""CPU time per generated token of each process of a local stack, one stream: where a
small model's one-stream time goes beside the worker's forward.

    python -m bench.micro.cpu_per_token [--model PATH] [--tokens 1000] [--threads 2]
        [--scheduler-args "..."]

A fresh stack (scheduler + one worker) serves one greedy gRPC stream of --tokens tokens
(EOS ignored) twice; over the second, each process's user + system CPU seconds (from
/proc, the process and its children) and this client's are divided by the tokens. With
two cores, whatever the scheduler and the client spend is taken from the worker's
threads: their sum against the wall time per token says how full the cores were.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import time

import grpc

from cbserve.local_stack import LocalStack
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc

PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                children += [int(child) for child in listed.read().split()]
        except FileNotFoundError:
            continue
    return [pid] + [p for child in children for p in process_tree(child)]


async def one_stream(address: str, tokens: int) -> int:
    sampling = pb.SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
    received = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        async for response in stub.Generate(pb.GenerateRequest(prompt=PROMPT, sampling=sampling)):
            received += len(response.token_ids)
    return received


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.cpu_per_token")
    parser.add_argument("--model", default=None, help="the worker's --model (default: its own)")
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2, help="the worker's --threads")
    parser.add_argument("--scheduler-args", default="", help="more scheduler flags")
    args = parser.parse_args(argv)
    worker_args = ["--threads", str(args.threads)]
    scheduler_args = shlex.split(args.scheduler_args)
    if args.model:
        worker_args += ["--model", args.model]
        scheduler_args += ["--tokenizer", args.model]
    with LocalStack(worker_args=worker_args, scheduler_args=scheduler_args) as stack:
        processes = {"scheduler": process_tree(stack.scheduler.process.pid)}
        for index, worker in enumerate(stack.workers):
            processes[f"worker {index}"] = process_tree(worker.process.pid)
        asyncio.run(one_stream(stack.address, args.tokens))  # warm: kernels, caches
        before = {name: sum(map(cpu_seconds, pids)) for name, pids in processes.items()}
        client_before, started = time.process_time(), time.monotonic()
        received = asyncio.run(one_stream(stack.address, args.tokens))
        wall = time.monotonic() - started
        client = time.process_time() - client_before
        after = {name: sum(map(cpu_seconds, pids)) for name, pids in processes.items()}
    print(f"{received} tokens in {wall:.3f} s: {wall / received * 1e3:.3f} ms a token (wall)")
    for name in processes:
        spent = (after[name] - before[name]) / received * 1e3
        print(f"  {name:10s} {spent:7.3f} ms CPU a token")
    print(f"  {'client':10s} {client / received * 1e3:7.3f} ms CPU a token")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
