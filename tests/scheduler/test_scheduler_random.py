"""Random workloads on small pools: the bookkeeping holds after every single step.

Random arrivals, prompt lengths, limits, stop rules, token scripts and aborts
(some while the request's step is in flight) against the real scheduler and
the protocol-checking fake worker. The pools are small, so requests are
preempted and recomputed, and filler prompts share prefixes; what the client
sees must be unaffected (the text checks). Half the workloads plan up to 4
decode steps at once (multi-step decoding). test_scheduler_simulation adds
priorities, deadlines and requests too long for the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_svc.core.request import FinishReason, Request
from scheduler_svc.output.detokenizer import REPLACEMENT_CHARACTER

from .books import check_books
from .harness import EOS, Harness, encode, load_tokenizer, make_request

# Pieces a script is made of: whole words, a character split over three
# tokens, EOS. Whole pieces keep the UTF-8 valid unless a limit cuts one.
PIECES = [encode(text) for text in (" the", " cat", " S", "TOP", ".", "\n", " 🤗")] + [[EOS]]
STOP_STRINGS = ("STOP", " cat.", "🤗", "\n\n", "the")
MAX_STEPS = 3000


@dataclass
class Spec:
    arrival_step: int
    prompt_len: int
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    tokens: list[int]
    abort_step: int | None
    abort_in_flight: bool


@st.composite
def workloads(draw):
    block_size = draw(st.integers(1, 6))
    num_blocks = draw(st.integers(2, 20))
    max_num_seqs = draw(st.integers(1, 5))
    budget = draw(st.integers(1, 24))
    max_model_len = draw(st.integers(3, 48))
    # Largest prompt + max_tokens whose KV (all but the last token) fits the pool.
    longest = min(max_model_len, num_blocks * block_size + 1)
    specs = []
    for _ in range(draw(st.integers(1, 8))):
        prompt_len = draw(st.integers(1, longest - 1))
        max_tokens = draw(st.integers(1, longest - prompt_len))
        pieces = draw(st.lists(st.sampled_from(PIECES), max_size=12))
        specs.append(
            Spec(
                arrival_step=draw(st.integers(0, 25)),
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                min_tokens=draw(st.integers(0, min(2, max_tokens))),
                ignore_eos=draw(st.booleans()),
                stop=tuple(draw(st.lists(st.sampled_from(STOP_STRINGS), max_size=2))),
                stop_token_ids=draw(st.sampled_from([(), tuple(encode("."))])),
                tokens=[token_id for piece in pieces for token_id in piece],
                abort_step=draw(st.none() | st.integers(0, 40)),
                abort_in_flight=draw(st.booleans()),
            )
        )
    harness = Harness(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        # Multi-step decoding: plans of up to 4 decode steps whenever all decode.
        num_scheduler_steps=draw(st.sampled_from([1, 4])),
        # Async scheduling: the next plan goes out before the last one's result is read.
        async_scheduling=draw(st.booleans()),
    )
    return harness, specs


def _check_bookkeeping(harness: Harness) -> None:
    check_books(harness.scheduler)
    # Every request fits the pool alone (see workloads), so none may fail.
    assert harness.errors == {}


def _check_plan(harness: Harness, plan) -> None:
    sequences = [*plan.new_sequences, *plan.continuing_sequences]
    config = harness.scheduler.config
    assert sum(seq.num_scheduled_tokens for seq in sequences) <= config.max_num_batched_tokens
    assert len(sequences) <= config.max_running_seqs
    assert 1 <= plan.num_steps <= config.num_scheduler_steps
    if plan.num_steps > 1:
        assert not plan.new_sequences
        assert all(seq.num_scheduled_tokens == 1 for seq in sequences)


def _check_text(harness: Harness, request: Request, spec: Spec) -> None:
    text = harness.text(request.request_id)
    token_ids = harness.token_ids(request.request_id)
    assert REPLACEMENT_CHARACTER not in text
    final = harness.outputs[request.request_id][-1]
    assert final.completion_tokens == len(token_ids) <= spec.max_tokens
    stopped_on_token = final.finish_reason is FinishReason.STOP and token_ids[-1] in (
        {EOS} | set(spec.stop_token_ids)
    )
    full = load_tokenizer().decode(token_ids[:-1] if stopped_on_token else token_ids)
    assert full.startswith(text)
    rest = full[len(text) :]
    if final.finish_reason is FinishReason.STOP and not stopped_on_token:
        # Text is cut right before the stop string that ended it.
        assert any(rest.startswith(stop) for stop in spec.stop)
    else:
        # Nothing held back but the bytes of a character the limit cut in two.
        assert rest == "" or REPLACEMENT_CHARACTER in rest
    if spec.min_tokens == 0:
        assert not any(stop in text for stop in spec.stop)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workload=workloads())
def test_random_workloads_keep_the_books_straight(workload):
    harness, specs = workload
    scheduler = harness.scheduler
    requests: list[tuple[Request, Spec]] = []
    pending = sorted(specs, key=lambda spec: spec.arrival_step)
    aborted: set[str] = set()

    def abort_due(step: int, in_flight: bool) -> None:
        for request, spec in requests:
            if spec.abort_step == step and spec.abort_in_flight == in_flight:
                if not request.is_finished:
                    aborted.add(request.request_id)
                scheduler.abort_request(request.request_id)

    for step in range(MAX_STEPS):
        while pending and pending[0].arrival_step <= step:
            spec = pending.pop(0)
            request = make_request(
                spec.prompt_len,
                max_tokens=spec.max_tokens,
                min_tokens=spec.min_tokens,
                ignore_eos=spec.ignore_eos,
                stop=spec.stop,
                stop_token_ids=spec.stop_token_ids,
            )
            requests.append((harness.add(request, tokens=spec.tokens), spec))
        abort_due(step, in_flight=False)
        plan = harness.schedule() if harness.may_send() else None
        if plan is not None:
            _check_plan(harness, plan)
            abort_due(step, in_flight=True)
            harness.send(plan)
        answered = harness.in_flight and (plan is None or not harness.may_send())
        if answered:
            harness.answer_oldest()
        _check_bookkeeping(harness)
        # Idle: nothing planned, nothing answered (whose stops the next plan tells).
        if plan is None and not answered and not pending and step > 40:
            break
    else:
        raise AssertionError(f"workload not done after {MAX_STEPS} steps")

    assert not scheduler.has_unfinished_requests()
    assert harness.block_manager.num_free_blocks == harness.block_manager.num_blocks
    # The worker was told to drop every sequence it ever saw.
    assert harness.worker.sequences == {}
    for request, spec in requests:
        assert request.is_finished
        if request.request_id in aborted:
            assert request.finish_reason is FinishReason.ABORT
            assert not harness.finished(request.request_id)
        else:
            # Exactly one final output (Harness.deliver refuses any after it).
            assert harness.finished(request.request_id)
            final_reason = harness.final(request.request_id).finish_reason
            # The core ends a request on its tokens; a stop string the edge finds in the
            # text of the very token that reached max_tokens makes the client's STOP.
            assert final_reason is request.finish_reason or (
                (final_reason, request.finish_reason) == (FinishReason.STOP, FinishReason.LENGTH)
            )
            _check_text(harness, request, spec)
