"""A client that reads slower than the steps come gets several steps' text in one
message; one that keeps up gets one message a step; nothing is lost or reordered."""

from __future__ import annotations

import asyncio

import grpc

from common.errors import ServiceError
from scheduler_svc.api.server import _coalesce
from scheduler_svc.core.request import FinishReason, RequestOutput


def _output(token_id: int, text: str, finish: FinishReason | None = None) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        new_token_ids=[token_id],
        new_text=text,
        logprobs=[],
        finish_reason=finish,
        prompt_tokens=3,
        completion_tokens=token_id,
    )


def _queue(*items) -> asyncio.Queue:
    queue: asyncio.Queue = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    return queue


def test_a_client_that_keeps_up_gets_one_message_a_step():
    first = _output(1, " a")
    merged, held = _coalesce(first, _queue())
    assert merged is first and held is None


def test_outputs_queued_behind_are_merged_up_to_the_final_one():
    queue = _queue(_output(2, " b"), _output(3, " c", FinishReason.STOP), _output(9, "x"))
    merged, held = _coalesce(_output(1, " a"), queue)
    assert (merged.new_token_ids, merged.new_text) == ([1, 2, 3], " a b c")
    assert merged.finish_reason is FinishReason.STOP and merged.completion_tokens == 3
    assert held is None and queue.qsize() == 1  # nothing is taken past the final output


def test_an_error_after_queued_outputs_comes_after_their_text():
    error = ServiceError("worker lost", grpc.StatusCode.UNAVAILABLE)
    merged, held = _coalesce(_output(1, " a"), _queue(_output(2, " b"), error))
    assert merged.new_text == " a b" and held is error
