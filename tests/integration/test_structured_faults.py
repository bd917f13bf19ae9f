"""Structured outputs through a worker loss: two workers serve constrained requests,
one is SIGKILLed while they decode, and every reply still parses and validates.

The requests on the lost worker are recomputed on the other one from prompt + the
tokens they had (Scheduler.take_unfinished / adopt); their matcher must be rebuilt
from those tokens, so the first mask there continues the text instead of starting
the grammar again (which would put a second "{" in the reply) or trusting a state
that counted a token the lost worker never sent. The kill comes once every stream
has a few tokens, by progress rather than by the clock, as in test_worker_faults, on
the same two workers (the session's `two_workers`, conftest.py); and once more on two
workers that speculate (constrained rows verify n-gram drafts, their masks a row per
draft position), so the kill also lands mid-speculation.
"""

from __future__ import annotations

import asyncio
import json
import signal

import grpc
import jsonschema
import pytest

from cbserve.local_stack import LocalStack
from cbserve.v1 import generation_pb2 as pb
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from tests.integration.conftest import WORKER_ARGS, WORKER_TIMEOUT_S
from tests.integration.liveness import requests_recomputed, wait_until, worker_connected
from tests.integration.stacks import started_stack, stop_stack, wait_until_idle
from tests.integration.test_speculative_decoding import SPECULATIVE_FLAGS
from tests.integration.test_structured_outputs import SCHEMAS

MAX_TOKENS = 64
AFTER_TOKENS = 3
# A reply of at least ~20 tokens, so that it is mid-way when the kill comes.
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "words": {
            "type": "array",
            "items": {"type": "string", "minLength": 3, "maxLength": 8},
            "minItems": 5,
            "maxItems": 5,
        }
    },
    "required": ["words"],
    "additionalProperties": False,
}
WORK = [LONG_SCHEMA, LONG_SCHEMA, *SCHEMAS[:8]]


def request(index: int, schema: dict) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        chat=pb.Chat(
            messages=[pb.ChatMessage(role="user", content=f"Request {index}: answer with JSON.")]
        ),
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        structured_output=pb.StructuredOutput(json_schema=json.dumps(schema)),
    )


async def run_with_kill(stack: LocalStack) -> tuple[list[tuple[str, int]], list[int]]:
    """Streams every request at once and SIGKILLs worker 0 once each has AFTER_TOKENS
    tokens (or has ended); returns each reply's (text, finish reason) and how many
    tokens each had at the kill."""
    texts = [""] * len(WORK)
    tokens = [0] * len(WORK)
    reasons = [0] * len(WORK)
    ready = asyncio.Event()

    async def one(stub, index: int) -> None:
        async for response in stub.Generate(request(index, WORK[index]), timeout=300):
            texts[index] += response.text
            tokens[index] += len(response.token_ids)
            reasons[index] = response.finish_reason or reasons[index]
            done = zip(tokens, reasons, strict=True)
            if all(count >= AFTER_TOKENS or reason for count, reason in done):
                ready.set()

    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        tasks = [asyncio.create_task(one(stub, index)) for index in range(len(WORK))]
        await asyncio.wait_for(ready.wait(), 300)
        at_kill = list(tokens)
        stack.workers[0].process.send_signal(signal.SIGKILL)
        await asyncio.gather(*tasks)
    return list(zip(texts, reasons, strict=True)), at_kill


@pytest.fixture(scope="module")
def two_speculative_workers():
    """As the session's two workers, with n-gram speculation (fixed drafts)."""
    running = started_stack(
        num_workers=2,
        worker_args=WORKER_ARGS,
        worker_metrics_ports=[0, 0],
        scheduler_args=["--worker-timeout", str(WORKER_TIMEOUT_S), *SPECULATIVE_FLAGS],
    )
    yield running
    stop_stack(running)


# make test kills a speculating worker mid-grammar; without speculation (16 s), and the
# plain mid-speculation kill (test_speculation_worker_kill.py), in make test-slow.
@pytest.mark.parametrize(
    "workers", [pytest.param("two_workers", marks=pytest.mark.slow), "two_speculative_workers"]
)
def test_constrained_replies_validate_after_a_worker_is_killed_mid_run(request, workers):
    stack = request.getfixturevalue(workers)
    lost_address = f"127.0.0.1:{stack.worker_ports[0]}"
    assert worker_connected(stack, lost_address)
    recomputed_before = requests_recomputed(stack)
    replies, at_kill = asyncio.run(run_with_kill(stack))
    wait_until(f"{lost_address} lost", lambda: not worker_connected(stack, lost_address))
    recomputed = requests_recomputed(stack) - recomputed_before
    # The kill hit requests mid-reply: some moved to the other worker mid-grammar.
    assert recomputed >= 1, (recomputed, at_kill)
    for (text, reason), schema in zip(replies, WORK, strict=True):
        assert reason == pb.STOP, (text, pb.FinishReason.Name(reason))
        jsonschema.validate(json.loads(text), schema)
    wait_until_idle(stack)
    drafts = stack.metrics().get("cbserve_spec_decode_num_draft_tokens_total", 0)
    print(
        f"\n[structured kill, {workers}] {int(recomputed)} of {len(WORK)} recomputed; at "
        f"kill {at_kill}; draft tokens verified {int(drafts)}"
    )
