"""Greedy JSON-schema replies with speculation off and on, one request at a time, on
the default model: tokens per second (completion tokens over each request's wall
time) and the drafts' acceptance, the systems alternated request by request so that
a busy machine's noise falls on all alike. Prints a table; the token ids of every
reply must be the same on every system (greedy).

    python -m bench.speculation.structured --rounds 3

Two workloads: `quoted`, whose prompts quote the reply (drafts found, as in editing),
and `held-out`, schemas answered from nothing (few drafts: the control).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import grpc

from cbserve.local_stack import LocalStack
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc

BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "author": {
            "type": "object",
            "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
            "required": ["first", "last"],
        },
        "year": {"type": "integer"},
    },
    "required": ["title", "author", "year"],
}
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["name", "qty"],
            },
            "maxItems": 4,
        },
        "status": {"enum": ["open", "paid", "shipped"]},
    },
    "required": ["id", "items", "status"],
}
A_BOOK = {"title": "Dune", "author": {"first": "Frank", "last": "Herbert"}, "year": 1965}
AN_ORDER = {
    "id": 4711,
    "items": [{"name": "apple", "qty": 3}, {"name": "pear", "qty": 2}, {"name": "fig", "qty": 9}],
    "status": "paid",
}
WORKLOADS = {
    "quoted": [
        (f"Copy this JSON exactly: {json.dumps(A_BOOK)}", BOOK),
        (f"Return this order as JSON, unchanged: {json.dumps(AN_ORDER)}", ORDER),
    ],
    "held-out": [
        ("Describe a famous book in JSON.", BOOK),
        ("Make up a small fruit order in JSON.", ORDER),
    ],
}
SPECULATIVE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
SYSTEMS = {
    "off": [],
    "on (adaptive)": ["--speculative-config", SPECULATIVE],
    "on (fixed)": ["--speculative-config", SPECULATIVE, "--speculative-drafts", "fixed"],
}
COUNTERS = ("num_draft_tokens", "num_accepted_tokens")


def one_reply(stack: LocalStack, text: str, schema: dict, max_tokens: int) -> tuple[list, float]:
    request = pb.GenerateRequest(
        chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=text)]),
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
        structured_output=pb.StructuredOutput(json_schema=json.dumps(schema)),
    )
    with grpc.insecure_channel(stack.address) as channel:
        generate = pb_grpc.GenerationStub(channel).Generate
        started = time.perf_counter()
        token_ids = [t for response in generate(request) for t in response.token_ids]
        return token_ids, time.perf_counter() - started


def counters(stack: LocalStack) -> dict[str, float]:
    metrics = stack.metrics()
    return {c: metrics.get(f"cbserve_spec_decode_{c}_total", 0.0) for c in COUNTERS}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speculation.structured")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--worker-args", default="", help="e.g. '--dtype q4_1'")
    args = parser.parse_args()
    stacks = {
        name: LocalStack(worker_args=args.worker_args.split(), scheduler_args=flags).start()
        for name, flags in SYSTEMS.items()
    }
    try:
        for stack in stacks.values():  # warm: first compilations, first steps
            one_reply(stack, *WORKLOADS["held-out"][0], max_tokens=8)
        print("| workload | system | tok/s (median) | tokens | drafts | accepted | same |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for workload, work in WORKLOADS.items():
            rates = {name: [] for name in stacks}
            tokens: dict[str, list] = {name: [] for name in stacks}
            before = {name: counters(stack) for name, stack in stacks.items()}
            for round_ in range(args.rounds):
                order = list(stacks) if round_ % 2 == 0 else list(reversed(stacks))
                for text, schema in work:
                    for name in order:
                        ids, seconds = one_reply(stacks[name], text, schema, args.max_tokens)
                        rates[name].append(len(ids) / seconds)
                        tokens[name].append(ids)
            reference = tokens["off"]
            for name, stack in stacks.items():
                grown = {c: counters(stack)[c] - before[name][c] for c in COUNTERS}
                print(
                    f"| {workload} | {name} | {statistics.median(rates[name]):.1f} | "
                    f"{sum(map(len, tokens[name]))} | {int(grown['num_draft_tokens'])} | "
                    f"{int(grown['num_accepted_tokens'])} | {tokens[name] == reference} |"
                )
    finally:
        for stack in stacks.values():
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
