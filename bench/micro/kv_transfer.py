"""How fast KV moves between two workers on one host (issue 46): SendKv of a sequence's
blocks from one worker process to another, copied by the destination straight out of the
source's shared pool (the default on one host: one copy), through the shared-memory ring
(a source started with --no-kv-pool-shared: two copies), and in the gRPC stream's
messages (to a destination started with --no-kv-transfer-shm), beside their references:
the loopback gRPC stream measured bare (the same bytes in the same message sizes to a
server that only counts them), and a plain memcpy of the same bytes (numpy, one buffer
into another, both already faulted in). The KV moved is whatever the blocks hold: the
bytes are the same.

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
import numpy as np

from cbserve.ports import free_port
from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc
from common.grpc_options import SERVER_OPTIONS, channel_options
from worker_svc.kv_transfer.layout import CHUNK_TARGET_BYTES

BLOCK_SIZE = 16
SINK_METHOD = "/bench.Sink/Take"


def start_worker(port: int, dtype: str, num_blocks: int, *extra: str) -> subprocess.Popen:
    args = ["--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--dtype", dtype]
    args += ["--num-kv-blocks", str(num_blocks), *extra]
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


def memcpy_seconds(total_bytes: int, runs: int) -> float:
    """Median seconds of one numpy copy of total_bytes into a buffer already faulted in."""
    source = np.ones(total_bytes, dtype=np.uint8)
    target = np.zeros_like(source)
    times = []
    for _ in range(runs + 1):  # the first faults nothing in any more, but warms caches
        started = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def timed_sends(stub, request: pb.SendKvRequest, runs: int) -> tuple[float, pb.SendKvReply]:
    """Median seconds of SendKv over runs, after one that dials (and settles the path)."""
    replies = []
    for run in range(runs + 1):
        request.transfer_id = run
        started = time.perf_counter()
        reply = stub.SendKv(request, timeout=120)
        replies.append((time.perf_counter() - started, reply))
    return statistics.median(s for s, _ in replies[1:]), replies[-1][1]


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
    ports = [free_port() for _ in range(5)]
    procs = [
        # The ring's and the stream's source keeps its pool private (the default shares
        # it, and a shared pool is copied from directly, never through the ring).
        start_worker(ports[0], args.dtype, blocks + 1, "--no-kv-pool-shared"),
        start_worker(ports[1], args.dtype, blocks + 1),
        start_worker(ports[2], args.dtype, blocks + 1, "--no-kv-transfer-shm"),
        start_worker(ports[4], args.dtype, blocks + 1, "--kv-pool-shared"),
    ]
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.micro.kv_transfer", "--sink", str(ports[3])]
    )
    try:
        ready = [wait_ready(proc) for proc in procs]
        print(ready[0])
        stubs = {
            port: worker_pb2_grpc.WorkerStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
            for port in (ports[0], ports[4])
        }
        ids = list(range(blocks))
        measured = {}
        for path, source, port in (
            ("shared pool", ports[4], ports[1]),
            ("shm ring", ports[0], ports[1]),
            ("gRPC bytes", ports[0], ports[2]),
        ):
            request = pb.SendKvRequest(
                destination=f"127.0.0.1:{port}",
                source_block_ids=ids,
                destination_block_ids=ids,
                num_tokens=args.tokens,
            )
            measured[path] = timed_sends(stubs[source], request, args.runs)
        sent = measured["gRPC bytes"][1]
        bare = statistics.median(
            asyncio.run(stream_seconds(ports[3], sent.bytes_sent)) for _ in range(args.runs)
        )
        memcpy = memcpy_seconds(sent.bytes_sent, args.runs)
        mib = sent.bytes_sent / 2**20
        print(
            f"SendKv {args.tokens} tokens ({blocks} blocks): {mib:.1f} MiB in "
            f"{sent.num_chunks} chunks, medians over {args.runs} runs"
        )
        for path, (seconds, reply) in measured.items():
            print(
                f"  {path:14s} {seconds * 1000:7.1f} ms = {mib / seconds:6.0f} MiB/s "
                f"(the source's own count: {reply.seconds * 1000:.1f} ms, "
                f"{reply.num_chunks} chunks); "
                f"{bare / seconds:.0%} of the bare stream, {memcpy / seconds:.0%} of memcpy"
            )
        print(f"  {'bare gRPC':14s} {bare * 1000:7.1f} ms = {mib / bare:6.0f} MiB/s")
        print(f"  {'memcpy':14s} {memcpy * 1000:7.1f} ms = {mib / memcpy:6.0f} MiB/s")
    finally:
        for proc in [*procs, sink]:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
