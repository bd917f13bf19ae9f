"""How fast KV moves between two workers on one host (issue 46): SendKv of a sequence's
blocks from one worker process to another, beside the loopback gRPC stream it runs on,
measured bare (the same bytes in the same message sizes to a server that only counts
them). The KV moved is whatever the blocks hold: the bytes are the same.

    .venv/bin/python -m bench.micro.kv_transfer [--tokens 2000] [--dtype auto] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import grpc

from cbserve.ports import free_port
from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from common.grpc_options import SERVER_OPTIONS, channel_options
from worker_svc.kv_transfer.layout import CHUNK_TARGET_BYTES

BLOCK_SIZE = 16
SINK_METHOD = "/bench.Sink/Take"


def start_worker(port: int, dtype: str, num_blocks: int) -> subprocess.Popen:
    args = ["--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--dtype", dtype]
    args += ["--num-kv-blocks", str(num_blocks)]
    return subprocess.Popen(
        [sys.executable, "-m", "worker_svc", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def wait_ready(proc: subprocess.Popen) -> str:
    for line in proc.stdout:
        if line.startswith("worker ready on "):
            return line.strip()
    raise SystemExit("a worker did not start")


async def serve_sink(port: int) -> None:
    """A gRPC server whose one client-streaming method counts the bytes it is sent."""

    async def take(chunks, _context):
        total = 0
        async for chunk in chunks:
            total += len(chunk)
        return total.to_bytes(8, "little")

    handler = grpc.stream_unary_rpc_method_handler(take)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.Sink", {"Take": handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def stream_seconds(port: int, total_bytes: int) -> float:
    """Seconds to stream total_bytes to the sink in CHUNK_TARGET_BYTES messages."""
    message = b"\1" * CHUNK_TARGET_BYTES
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", channel_options(10.0)) as channel:
        take = channel.stream_unary(SINK_METHOD)
        await take(iter([b"x"]), wait_for_ready=True)  # connected before the clock starts

        def chunks():
            for start in range(0, total_bytes, CHUNK_TARGET_BYTES):
                yield message[: min(CHUNK_TARGET_BYTES, total_bytes - start)]

        started = time.perf_counter()
        await take(chunks())
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--dtype", default="auto", help="the workers' --dtype")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        asyncio.run(serve_sink(args.sink))
        return
    blocks = -(-args.tokens // BLOCK_SIZE)
    ports = [free_port(), free_port(), free_port()]
    procs = [start_worker(port, args.dtype, blocks + 1) for port in ports[:2]]
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.micro.kv_transfer", "--sink", str(ports[2])]
    )
    try:
        ready = [wait_ready(proc) for proc in procs]
        print(ready[0])
        stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(f"127.0.0.1:{ports[0]}"))
        ids = list(range(blocks))
        request = pb.SendKvRequest(
            destination=f"127.0.0.1:{ports[1]}",
            source_block_ids=ids,
            destination_block_ids=ids,
            num_tokens=args.tokens,
        )
        replies = []
        for run in range(args.runs + 1):  # the first dials the destination: not counted
            request.transfer_id = run
            started = time.perf_counter()
            reply = stub.SendKv(request, timeout=120)
            replies.append((time.perf_counter() - started, reply))
        seconds = statistics.median(s for s, _ in replies[1:])
        sent = replies[-1][1]
        bare = statistics.median(
            asyncio.run(stream_seconds(ports[2], sent.bytes_sent)) for _ in range(args.runs)
        )
        mib = sent.bytes_sent / 2**20
        print(
            f"SendKv {args.tokens} tokens ({blocks} blocks): {mib:.1f} MiB in "
            f"{sent.num_chunks} chunks, median {seconds * 1000:.1f} ms over {args.runs} runs "
            f"= {mib / seconds:.0f} MiB/s (the source's own count: {sent.seconds * 1000:.1f} ms)"
        )
        print(
            f"bare loopback gRPC stream, same bytes and message size: {bare * 1000:.1f} ms "
            f"= {mib / bare:.0f} MiB/s; SendKv reaches {bare / seconds:.0%} of it"
        )
    finally:
        for proc in [*procs, sink]:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
