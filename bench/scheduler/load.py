"""The scheduler benchmark's load generator: one lean client process, many streams.

    python -m bench.scheduler.load --front grpc --address 127.0.0.1:50051 --streams 64 \
        --watch scheduler=PID

Each of --streams streams sends --requests-per-stream requests one after the other
(a closed loop: as many in flight as streams), each a prompt of --prompt-len random
token ids asking for exactly --output-len tokens (EOS ignored), over gRPC
(`Generation.Generate`, one channel) or the OpenAI-compatible HTTP front
(/v1/completions, streamed); the first --constrained-streams streams ask for a JSON
schema (or, with --constraint regex, a regex) as a structured output (gRPC's
structured_output, HTTP's structured_outputs), and their requests may end sooner,
when the schema is complete; their tokens are also counted apart. It runs in its own
process so that its CPU is not the server's, and does as little as it can per message
(counts them; JSON is parsed only for the last chunk of an HTTP stream), because on a
2-core machine it shares the CPU with what it measures. It reads the CPU of the
--watch processes and its own at the start and end of the load and prints one JSON
object (LoadResult) on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field

from bench.scheduler.cpu_accounting import cpu_snapshot, cpu_used, machine_cpu_s, own_cpu_s

MAX_ERRORS_KEPT = 5
# The constrained streams' schema: an order with open strings, numbers, an enum, a
# nested object and a list, as an extraction or agent reply would have. The null
# worker walks it at random within the masks, mostly inside strings (a token with a
# quote ends one), so most replies run to --output-len.
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name", "email"],
        },
        "status": {"enum": ["open", "paid", "shipped"]},
        "total": {"type": "number"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["sku", "quantity"],
            },
        },
        "note": {"type": "string"},
    },
    "required": ["customer", "status", "total", "items", "note"],
}

# The regex streams' pattern: words and numbers without end, so that a null worker's
# walk within it runs to --output-len as a free stream does.
REGEX = r"([a-z]+|[0-9]+)( ([a-z]+|[0-9]+))*"


@dataclass
class LoadResult:
    front: str
    streams: int
    requests: int
    wall_s: float = 0.0
    completed: int = 0  # requests that ended normally with exactly output_len tokens
    tokens: int = 0
    # Of the tokens, those of the constrained streams; and the seconds the constrained
    # and the free streams took, summed over the streams of each kind.
    constrained_tokens: int = 0
    constrained_stream_s: float = 0.0
    free_stream_s: float = 0.0
    messages: int = 0
    client_cpu_s: float = 0.0
    # Every process on the machine, this one and the watched ones included.
    machine_cpu_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def fail(self, error: str) -> None:
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(error)


def prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Random token ids, different for every request so that no prefix cache hits."""
    rng = random.Random(seed)
    # The low ids are special tokens in most vocabularies.
    return [[rng.randrange(256, vocab_size) for _ in range(length)] for _ in range(count)]


def constrained(args, stream: int) -> bool:
    """Whether a stream's requests carry the JSON schema: the first --constrained-streams."""
    return stream < args.constrained_streams


def completed(args, is_constrained: bool, tokens: int, length_reached: bool) -> bool:
    """A free request streams exactly --output-len tokens; a constrained one may end
    sooner, when the null worker's random walk through the schema completes it."""
    if is_constrained:
        return 0 < tokens <= args.output_len
    return tokens == args.output_len and length_reached


async def _grpc_streams(args, result: LoadResult, batches: list[list[list[int]]]) -> None:
    import grpc

    from cbserve.v1 import generation_pb2 as pb
    from cbserve.v1 import generation_pb2_grpc

    schema = json.dumps(JSON_SCHEMA)

    def request(ids: list[int], is_constrained: bool) -> pb.GenerateRequest:
        sampling = pb.SamplingParams(max_tokens=args.output_len, ignore_eos=True)
        message = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=ids), sampling=sampling)
        if is_constrained and args.constraint == "regex":
            message.structured_output.regex = REGEX
        elif is_constrained:
            message.structured_output.json_schema = schema
        return message

    requests = [
        [request(ids, constrained(args, index)) for ids in batch]
        for index, batch in enumerate(batches)
    ]
    async with grpc.aio.insecure_channel(args.address) as channel:
        await generation_pb2_grpc.GenerationStub(channel).GetModelInfo(pb.GetModelInfoRequest())
        # Responses stay bytes (no deserializer): parsing each one would cost this process
        # more CPU than any other per-message work it does. The last one is parsed for
        # its usage and finish reason.
        generate = channel.unary_stream(
            "/cbserve.v1.Generation/Generate",
            request_serializer=pb.GenerateRequest.SerializeToString,
            response_deserializer=None,
        )

        async def stream(own: list) -> None:
            for message in own:
                is_constrained = message.HasField("structured_output")
                messages = 0
                last = b""
                try:
                    async for response in generate(message):
                        messages += 1
                        last = response
                except grpc.aio.AioRpcError as error:
                    result.fail(f"{error.code().name}: {error.details()}")
                    continue
                final = pb.GenerateResponse.FromString(last)
                tokens = final.usage.completion_tokens
                result.tokens += tokens
                result.constrained_tokens += tokens if is_constrained else 0
                result.messages += messages
                if completed(args, is_constrained, tokens, final.finish_reason == pb.LENGTH):
                    result.completed += 1
                else:
                    result.fail(f"{tokens} tokens, finish reason {final.finish_reason}")

        await _timed(args, result, [stream(own) for own in requests])


async def _http_streams(args, result: LoadResult, batches: list[list[list[int]]]) -> None:
    import aiohttp

    def body(ids: list[int], is_constrained: bool) -> bytes:
        fields = {
            "prompt": ids,
            "max_tokens": args.output_len,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if is_constrained:
            kind = args.constraint
            fields["structured_outputs"] = {kind: REGEX if kind == "regex" else JSON_SCHEMA}
        return json.dumps(fields).encode()

    bodies = [
        [(body(ids, constrained(args, index)), constrained(args, index)) for ids in batch]
        for index, batch in enumerate(batches)
    ]
    url = f"http://{args.address}/v1/completions"
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)  # one connection per stream, none queued
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async with session.get(f"http://{args.address}/v1/models") as response:
            await response.read()

        async def stream(own: list[tuple[bytes, bool]]) -> None:
            for data, is_constrained in own:
                tokens = messages = 0
                try:
                    async with session.post(url, data=data, headers=headers) as response:
                        if response.status != 200:
                            result.fail(f"HTTP {response.status}: {(await response.text())[:200]}")
                            continue
                        async for line in response.content:
                            if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                                continue
                            messages += 1
                            if b'"completion_tokens"' in line:  # the last chunk: usage
                                usage = json.loads(line[5:])["usage"]
                                tokens = usage["completion_tokens"]
                except aiohttp.ClientError as error:
                    result.fail(f"{type(error).__name__}: {error}")
                result.tokens += tokens
                result.constrained_tokens += tokens if is_constrained else 0
                result.messages += messages
                if completed(args, is_constrained, tokens, tokens == args.output_len):
                    result.completed += 1
                else:
                    result.fail(f"{tokens} tokens in {messages} chunks")

        await _timed(args, result, [stream(own) for own in bodies])


async def _timed(args, result: LoadResult, streams: list) -> None:
    """Runs the streams between two CPU readings of the watched processes and this one."""
    watched = dict(item.split("=", 1) for item in args.watch)
    roots = {label: int(pid) for label, pid in watched.items()}
    before, own_before, machine_before = cpu_snapshot(roots), own_cpu_s(), machine_cpu_s()
    started = time.perf_counter()

    async def timed(index: int, stream) -> None:
        # Each stream's own time: a stream that gets fewer tokens a step takes longer.
        began = time.perf_counter()
        await stream
        if constrained(args, index):
            result.constrained_stream_s += time.perf_counter() - began
        else:
            result.free_stream_s += time.perf_counter() - began

    await asyncio.gather(*(timed(index, stream) for index, stream in enumerate(streams)))
    result.wall_s = time.perf_counter() - started
    result.client_cpu_s = own_cpu_s() - own_before
    result.machine_cpu_s = machine_cpu_s() - machine_before
    result.cpu_s = cpu_used(before, cpu_snapshot(roots))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.load", description=__doc__)
    parser.add_argument("--front", choices=("grpc", "http"), required=True)
    parser.add_argument("--address", required=True, help="host:port of the front")
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=49152)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--constrained-streams",
        type=int,
        default=0,
        help="how many of the streams ask for a structured output (--constraint)",
    )
    parser.add_argument(
        "--constraint",
        choices=("json", "regex"),
        default="json",
        help="what those streams ask for: JSON_SCHEMA or REGEX",
    )
    parser.add_argument(
        "--watch", action="append", default=[], metavar="LABEL=PID", help="read this CPU"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if min(args.streams, args.requests_per_stream, args.prompt_len, args.output_len) < 1:
        raise SystemExit("scheduler_load: counts and lengths must be >= 1")
    count = args.streams * args.requests_per_stream
    all_prompts = prompts(count, args.prompt_len, args.vocab_size, args.seed)
    per = args.requests_per_stream
    batches = [all_prompts[i * per : (i + 1) * per] for i in range(args.streams)]
    result = LoadResult(front=args.front, streams=args.streams, requests=count)
    drive = _grpc_streams if args.front == "grpc" else _http_streams
    import uvloop

    uvloop.run(drive(args, result, batches))
    print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
