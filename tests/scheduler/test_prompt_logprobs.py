"""Prompt logprobs through the real scheduler and the fake worker: asked per new
sequence, gathered over a chunked prefill, sent once with the first output, never
read from the prefix cache, and neither lost nor sent twice when a request moves to
another worker before or after its first token."""

from __future__ import annotations

import math

import pytest

from scheduler_svc.api.wire import to_response
from scheduler_svc.core.plan import PromptLogprobsSlice, StepOutput
from scheduler_svc.core.prompt_logprobs import attach_prompt_logprobs, take_prompt_logprobs
from scheduler_svc.core.request import RequestOutput

from .books import check_books
from .fake_worker import fake_prompt_logprob
from .harness import Harness, encode, load_tokenizer, make_request, unique_prompt

PROMPT = unique_prompt(30)
WORDS = encode(" the cat sat on the mat and slept")


def _check_scored(output: RequestOutput, prompt: list[int], num_top: int) -> None:
    entries = output.prompt_logprobs
    assert [e.token_id for e in entries] == prompt
    assert math.isnan(entries[0].logprob) and entries[0].top == ()
    for position, entry in enumerate(entries[1:], start=1):
        assert entry.logprob == fake_prompt_logprob(position)
        token = prompt[position]
        assert entry.top == tuple((token + rank, -float(rank)) for rank in range(num_top))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_chunked_prefill_gathers_every_slice_and_the_first_output_carries_them(
    async_scheduling,
):
    harness = Harness(max_num_batched_tokens=8, async_scheduling=async_scheduling)
    # The same prompt computed before: its blocks are in the prefix cache.
    harness.add(make_request(PROMPT, max_tokens=2), tokens=WORDS)
    harness.run()
    request = harness.add(make_request(PROMPT, max_tokens=4, prompt_logprobs=2), tokens=WORDS)
    harness.run()
    asks = [s for plan in harness.worker.plans for s in plan.new_sequences]
    [asked] = [s for s in asks if s.seq_id == request.seq_id]
    # The cached blocks were not taken: their positions have no logits.
    assert asked.prompt_logprobs == 2 and asked.num_computed_tokens == 0
    assert harness.final(request.request_id).cached_prompt_tokens == 0
    first, *rest = harness.outputs[request.request_id]
    _check_scored(first, PROMPT, 2)
    assert all(output.prompt_logprobs is None for output in rest)
    assert harness.token_ids(request.request_id) == WORDS[:4]
    assert request.prompt_logprobs == [] and request.prompt_logprobs_sent


def test_a_request_that_did_not_ask_gets_none_and_asks_nothing():
    harness = Harness(max_num_batched_tokens=8)
    request = harness.add(make_request(PROMPT, max_tokens=2), tokens=WORDS)
    harness.run()
    assert all(
        not s.HasField("prompt_logprobs") for p in harness.worker.plans for s in p.new_sequences
    )
    assert all(o.prompt_logprobs is None for o in harness.outputs[request.request_id])


def _move(source: Harness, destination: Harness) -> None:
    for request in source.scheduler.take_unfinished():
        destination.adopt(request, source)


@pytest.mark.parametrize("steps_before", [1, 2, 4, 6])
def test_a_request_moved_to_another_worker_is_scored_once(steps_before):
    """Moved mid-prefill it is scored again from the start; moved after its first
    token it asks for nothing more and the client gets no second copy."""
    source = Harness(max_num_batched_tokens=8)
    request = source.add(make_request(PROMPT, max_tokens=6, prompt_logprobs=0), tokens=WORDS)
    for _ in range(steps_before):
        source.step()
    sent_before = request.prompt_logprobs_sent
    assert sent_before == (steps_before >= 4)  # chunks of 8, 8, 8 and 6: a token at the 4th
    destination = Harness(max_num_batched_tokens=8)
    _move(source, destination)
    destination.run()
    check_books(destination.scheduler)
    [resumed] = [s for p in destination.worker.plans for s in p.new_sequences]
    assert resumed.HasField("prompt_logprobs") is not sent_before
    outputs = destination.outputs[request.request_id]
    carrying = [o for o in outputs if o.prompt_logprobs is not None]
    assert len(carrying) == 1 and carrying[0] is outputs[0]
    _check_scored(carrying[0], PROMPT, 0)
    assert destination.token_ids(request.request_id) == WORDS[:6]


def test_a_slice_that_restarts_overwrites_and_a_gap_is_refused():
    request = make_request([5, 6, 7, 8, 9], prompt_logprobs=0)

    def slice_from(first: int, values: list[float]) -> StepOutput:
        scored = PromptLogprobsSlice(first, values, [()] * len(values))
        return StepOutput(step_id=1, prompt_logprobs={request.seq_id: scored})

    take_prompt_logprobs(request, slice_from(1, [-1.0, -2.0]))
    take_prompt_logprobs(request, slice_from(1, [-3.0]))  # a prefill started again
    assert [e.logprob for e in request.prompt_logprobs] == [-3.0]
    with pytest.raises(RuntimeError, match="position 3"):
        take_prompt_logprobs(request, slice_from(3, [-4.0]))
    take_prompt_logprobs(request, slice_from(2, [-4.0, -5.0, -6.0]))
    output = RequestOutput(request.request_id, [1], "x", [], None, 5, 1)
    attach_prompt_logprobs(request, output)
    response = to_response(output, load_tokenizer())
    assert [e.token_id for e in response.prompt_logprobs] == [5, 6, 7, 8, 9]
    assert math.isnan(response.prompt_logprobs[0].logprob)
    assert [e.logprob for e in response.prompt_logprobs[1:]] == [-3.0, -4.0, -5.0, -6.0]
    # Sent: the next output carries nothing.
    later = RequestOutput(request.request_id, [2], "y", [], None, 5, 2)
    assert attach_prompt_logprobs(request, later).prompt_logprobs is None


def test_a_one_token_prompt_gets_its_one_unscored_entry():
    harness = Harness()
    request = harness.add(make_request([7], max_tokens=2, prompt_logprobs=1), tokens=WORDS)
    harness.run()
    first, second = harness.outputs[request.request_id]
    [entry] = first.prompt_logprobs
    assert entry.token_id == 7 and math.isnan(entry.logprob) and second.prompt_logprobs is None
