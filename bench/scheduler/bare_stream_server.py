"""The floor of Python gRPC streaming: `cbserve.v1.Generation` that does nothing else.

    python -m bench.scheduler.bare_stream_server --port 50071 [--step-ms 0]

Generate answers any request with max_tokens messages of one token each, built the
way the scheduler builds them (request id, the token's text, its id; finish reason and
usage on the last), as fast as the event loop sends them, or one per --step-ms, and
does no tokenizing, scheduling, detokenizing or metrics. The scheduler benchmark
(bench/scheduler/run.py) drives it with the same clients and load as the real
scheduler, in the same run: its CPU per message is what any grpc.aio server on this
machine pays, and the scheduler's CPU per token is judged against it.
Same stack as the scheduler: grpc.aio on a uvloop event loop, the same server options.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import uuid

import grpc

from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc
from common.grpc_options import SERVER_OPTIONS

DEFAULT_MAX_TOKENS = 256
# Word pieces to send as text: a token's text is a few bytes, as the scheduler's are.
PIECES = tuple(f" w{i}" for i in range(1000))


class BareGeneration(generation_pb2_grpc.GenerationServicer):
    def __init__(self, step_s: float = 0.0) -> None:
        self.step_s = step_s
        self.messages = 0

    async def Generate(self, request, context):  # noqa: N802 (gRPC method name)
        request_id = request.request_id or uuid.uuid4().hex
        sampling = request.sampling
        count = sampling.max_tokens if sampling.HasField("max_tokens") else DEFAULT_MAX_TOKENS
        prompt_tokens = len(request.prompt_token_ids.ids)
        for index in range(count):
            if self.step_s:
                await asyncio.sleep(self.step_s)
            token_id = index % len(PIECES)
            response = pb.GenerateResponse(
                request_id=request_id, text=PIECES[token_id], token_ids=[token_id]
            )
            if index == count - 1:
                response.finish_reason = pb.LENGTH
                response.usage.prompt_tokens = prompt_tokens
                response.usage.completion_tokens = count
            self.messages += 1
            yield response

    async def GetModelInfo(self, request, context):  # noqa: N802 (gRPC method name)
        return pb.ModelInfo(model_name="bare-stream-server", vocab_size=len(PIECES))


async def serve(host: str, port: int, step_s: float) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    generation_pb2_grpc.add_GenerationServicer_to_server(BareGeneration(step_s), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise SystemExit(f"bare_stream_server: cannot bind {host}:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The ready line LocalStack's ChildProcess waits for (" ready ").
    print(f"bare stream server ready on {host}:{bound}", flush=True)
    await stop.wait()
    await server.stop(grace=0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scheduler.bare_stream_server", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--step-ms", type=float, default=0.0, help="pause before each message")
    args = parser.parse_args(argv)
    if args.step_ms < 0:
        parser.error("--step-ms must be >= 0")
    import uvloop

    from common import parent_watch

    parent_watch.die_with_parent()
    uvloop.run(serve(args.host, args.port, args.step_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
