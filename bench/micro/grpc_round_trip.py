"""What one step's round trip on the Step stream costs, with nothing else in it:

    .venv/bin/python -m bench.micro.grpc_round_trip [--round-trips 3000] [--unix-socket]

A grpc.aio server whose Step handler answers each plan at once with a one-token result,
and a client writing one-row decode plans and reading each answer before the next, both
in this process on uvloop, as the scheduler and the worker run theirs. Prints the wall
and CPU microseconds of a round trip (both ends together): the floor under every served
token that neither the forward nor the scheduler's logic explains. `--unix-socket` puts
the channel on a Unix socket instead of TCP loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import grpc

from cbserve.worker.v1 import worker_pb2 as pb
from cbserve.worker.v1 import worker_pb2_grpc as pb_grpc


class _Answering(pb_grpc.WorkerServicer):
    async def Step(self, request_iterator, context):  # noqa: N802 (the proto's name)
        async for plan in request_iterator:
            result = pb.StepResult(step_id=plan.step_id, num_tokens=1)
            result.seq_ids.append(1)
            result.token_ids.append(42)
            yield result


async def measure(round_trips: int, target: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of one round trip, averaged over `round_trips`."""
    server = grpc.aio.server()
    pb_grpc.add_WorkerServicer_to_server(_Answering(), server)
    if target is None:
        target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    else:
        server.add_insecure_port(target)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            call = pb_grpc.WorkerStub(channel).Step()
            for warm_up in range(100):
                await call.write(pb.StepPlan(step_id=warm_up + 1))
                await call.read()
            cpu, wall = time.process_time(), asyncio.get_running_loop().time()
            for step_id in range(101, 101 + round_trips):
                plan = pb.StepPlan(step_id=step_id)
                plan.continuing_sequences.add(seq_id=1, num_scheduled_tokens=1)
                await call.write(plan)
                await call.read()
            wall = asyncio.get_running_loop().time() - wall
            cpu = time.process_time() - cpu
            await call.done_writing()
    finally:
        await server.stop(0)
    return wall / round_trips, cpu / round_trips


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.grpc_round_trip") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--round-trips", type=int, default=3000)
    parser.add_argument("--unix-socket", action="store_true")
    args = parser.parse_args(argv)
    import uvloop

    with tempfile.TemporaryDirectory() as directory:
        target = f"unix:{Path(directory) / 'step.sock'}" if args.unix_socket else None
        wall, cpu = uvloop.run(measure(args.round_trips, target))
    where = "a Unix socket" if args.unix_socket else "TCP loopback"
    print(
        f"{args.round_trips} Step round trips over {where}: {wall * 1e6:.0f} µs wall, "
        f"{cpu * 1e6:.0f} µs CPU each (both ends)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
