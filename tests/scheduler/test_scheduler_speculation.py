"""Speculative decoding's accounting in the scheduler, against the fake worker.

The fake worker writes the KV of every draft it verifies, so a rejected draft leaves
a stale slot; it checks that every position a step reads holds the sequence's own
KV, so a scheduler that counted a rejected draft as computed, or cached a block
holding one, fails here. The tokens streamed must be exactly the script's, with
speculation on or off, one plan at a time or two in flight.
"""

from __future__ import annotations

import pytest

from scheduler_svc.core.draft_record import DraftRecord
from scheduler_svc.core.plan import StepOutput, StepPlan
from scheduler_svc.core.speculation import StepCost
from scheduler_svc.structured.compiler import GrammarCompiler

from .books import check_books
from .harness import THE, Harness, encode, load_tokenizer, make_request, unique_prompt
from .test_scheduler_structured import ANSWER, assert_valid, constrained, free

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve thirteen")
SPECULATE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer())


def guessing(harness: Harness, right: int):
    """A drafter that proposes the script's next `right` tokens correctly, then wrong ones."""

    def drafter(seq_id: int, index: int, room: int) -> list[int]:
        script = harness.scripts[seq_id]
        truth = [script[i] if i < len(script) else THE for i in range(index, index + room)]
        return [t if i < right else t + 1 for i, t in enumerate(truth)]

    return drafter


def run_all(harness: Harness, requests) -> dict[str, list[int]]:
    for _ in range(500):
        if harness.step() is None:
            break
        check_books(harness.scheduler)
    return {r.request_id: harness.token_ids(r.request_id) for r in requests}


def generate(*, drafts: bool, right: int = 2, async_scheduling: bool = False, **config):
    harness = Harness(
        drafts=drafts,
        speculative_config=SPECULATE,
        async_scheduling=async_scheduling,
        **config,
    )
    harness.worker.drafter = guessing(harness, right)
    requests = [
        harness.add(make_request(unique_prompt(n), f"r{n}", max_tokens=11), tokens=WORDS)
        for n in (5, 9, 14)
    ]
    return harness, run_all(harness, requests)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("right", [0, 1, 3, 4])
def test_drafts_stream_exactly_the_tokens_of_plain_decodes(async_scheduling, right):
    _, plain = generate(drafts=False, async_scheduling=async_scheduling)
    harness, spec = generate(drafts=True, right=right, async_scheduling=async_scheduling)
    assert spec == plain
    assert all(len(tokens) == 11 for tokens in spec.values())  # max_tokens, never past it
    stats = harness.scheduler.stats.drafts
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_drafts
    # Each verified draft accepts at most `right` tokens (the drafter's correct ones).
    assert stats.num_accepted_tokens <= right * stats.num_drafts
    if right:
        assert stats.accepted_per_position[0] > 0
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens


def test_rejections_roll_back_computed_tokens_and_pending_samples():
    harness = Harness(drafts=True, speculative_config=SPECULATE)
    harness.worker.drafter = guessing(harness, right=1)
    request = harness.add(make_request(unique_prompt(6), max_tokens=30), tokens=WORDS)
    harness.step()  # the prefill: no drafts for a sequence the worker does not hold
    plan = harness.step()
    (sequence,) = plan.continuing_sequences
    assert sequence.num_draft_tokens == 4 and plan.ngram_lookup == (3, 3)
    # Four drafts, one right: two tokens taken, three positions rolled back.
    assert request.num_output_tokens == 3
    assert request.num_pending_samples == 0
    assert request.num_computed_tokens == request.num_tokens - 1
    check_books(harness.scheduler)


def test_the_prefix_cache_shares_only_blocks_of_accepted_tokens():
    first = Harness(drafts=True, speculative_config=SPECULATE, block_size=4)
    first.worker.drafter = guessing(first, right=2)
    prompt = unique_prompt(7)
    request = first.add(make_request(prompt, "a", max_tokens=12), tokens=WORDS)
    first.run()
    # The same scheduler then serves the first request's whole text as a prompt: every
    # full block of it is found in the cache, and the fake worker checks that each
    # cached position holds that text's own KV (no stale draft).
    follow = make_request(prompt + first.token_ids("a"), "b", max_tokens=2)
    first.add(follow, tokens=WORDS)
    first.run()
    assert follow.cached_prompt_tokens == (len(prompt) + 12 - 1) // 4 * 4
    assert request.is_finished and first.finished("b")


def test_a_request_moved_mid_speculation_resumes_token_identically():
    _, plain = generate(drafts=False, async_scheduling=True)
    source = Harness(drafts=True, speculative_config=SPECULATE, async_scheduling=True)
    source.worker.drafter = guessing(source, right=2)
    requests = [
        source.add(make_request(unique_prompt(n), f"r{n}", max_tokens=11), tokens=WORDS)
        for n in (5, 9, 14)
    ]
    for _ in range(2):  # prefill, then drafting decodes, with a plan still in flight
        source.step()
    assert source.in_flight and source.scheduler.stats.drafts.num_drafts
    destination = Harness(drafts=True, speculative_config=SPECULATE, async_scheduling=True)
    destination.worker.drafter = guessing(destination, right=2)
    for request in source.scheduler.take_unfinished():
        destination.adopt(request, source)
    destination.run()
    for request in requests:
        streamed = [t for o in destination.outputs[request.request_id] for t in o.new_token_ids]
        assert streamed and streamed == plain[request.request_id][-len(streamed) :]
        assert len(plain[request.request_id]) == 11


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_wrong_guesses_keep_a_constrained_reply_valid(compiler, async_scheduling):
    """The fake's drafts here are not the n-gram lookup's, so the scheduler's draft
    rows (test_scheduler_constrained_drafts.py) never follow them: the constrained row
    emits one token a step, masked, and its reply stays valid."""
    harness = Harness(drafts=True, speculative_config=SPECULATE, async_scheduling=async_scheduling)
    harness.worker.drafter = guessing(harness, right=4)
    free(harness, "free", max_tokens=10)
    constrained(compiler, harness, "json", encode(ANSWER))
    plans = []
    while (plan := harness.step()) is not None:
        plans.append(plan)
        check_books(harness.scheduler)
    drafted = {s.seq_id for p in plans for s in p.continuing_sequences if s.num_draft_tokens}
    assert drafted == {harness.requests["free"].seq_id, harness.requests["json"].seq_id}
    json_id = harness.requests["json"].seq_id
    assert all(n == 1 for seq_id, _, n, _ in harness.worker.draft_log if seq_id == json_id)
    assert_valid(harness, "json")
    assert len(harness.token_ids("free")) == 10


def test_no_drafts_without_a_worker_that_verifies_them_or_a_config():
    for harness in (
        Harness(drafts=False, speculative_config=SPECULATE),
        Harness(drafts=True),
    ):
        harness.add(make_request(unique_prompt(5), max_tokens=6), tokens=WORDS)
        while (plan := harness.step()) is not None:
            assert all(s.num_draft_tokens == 0 for s in plan.continuing_sequences)


def test_drafts_stop_where_a_row_costs_more_than_it_is_likely_to_give():
    harness = Harness(drafts=True, speculative_config=SPECULATE)
    speculation = harness.scheduler.speculation
    request = make_request(8)
    # A step of T rows taking 10 ms + 0.5 ms * T: c = 0.05.
    for rows in (1, 2, 3, 4, 5) * 4:
        speculation.cost.observe(rows, 0.010 + 0.0005 * rows)
    assert speculation.cost.ratio == pytest.approx(0.05, rel=1e-6)
    # Acceptance 1/2 (the prior): at batch 1 a row pays while 0.5^i > 0.048 (i <= 4).
    assert speculation.draft_room(request, batch_tokens=1, limit=8) == 4
    # At batch 64 a row costs 3.2 / 4.2 of what it may give: none pays at 0.5...
    assert speculation.draft_room(request, batch_tokens=64, limit=8) == 0
    # ... two do at acceptance 0.9 (0.9^2 = 0.81 > 0.76 > 0.9^3).
    request.draft_record = DraftRecord(accepted=9, trials=10)
    assert speculation.draft_room(request, batch_tokens=64, limit=8) == 2
    assert speculation.draft_room(request, batch_tokens=64, limit=1) == 1


def test_the_cost_fit_ignores_prefills_and_falls_back_without_varied_rows():
    cost = StepCost()
    for _ in range(20):
        cost.observe(8, 0.02)  # rows never vary: no slope to measure
    assert cost.ratio == StepCost.PRIOR_RATIO
    for rows in (1, 9) * 10:
        cost.observe(rows, 0.001 * rows - 0.0005)  # all of the cost scales with the rows
    assert cost.ratio == StepCost.MAX_RATIO
    harness = Harness(drafts=True, speculative_config=SPECULATE)
    speculation = harness.scheduler.speculation
    prefill = StepPlan(step_id=1, new_sequences=[object()])  # type: ignore[list-item]
    speculation.observe_step(prefill, StepOutput(step_id=1, num_tokens=500, forward_seconds=1))
    assert speculation.cost._w == 0


def test_a_request_whose_drafts_stopped_paying_tries_again_later():
    harness = Harness(drafts=True, speculative_config=SPECULATE)
    speculation = harness.scheduler.speculation
    for rows in (1, 2, 3, 4, 5) * 4:
        speculation.cost.observe(rows, 0.010 + 0.0005 * rows)
    request = make_request(8)
    request.draft_record = DraftRecord(accepted=0.0, trials=10.0)
    assert speculation.draft_room(request, batch_tokens=1, limit=4) == 0
    for _ in range(40):  # decodes planned without drafts
        request.draft_record.relax()
    assert speculation.draft_room(request, batch_tokens=1, limit=4) > 0


def test_fixed_drafts_give_every_decode_num_speculative_tokens():
    harness = Harness(drafts=True, speculative_config=SPECULATE, speculative_drafts="fixed")
    harness.worker.drafter = guessing(harness, right=0)
    harness.add(make_request(unique_prompt(5), "a", max_tokens=9), tokens=WORDS)
    rooms = []
    while (plan := harness.step()) is not None:
        rooms += [s.num_draft_tokens for s in plan.continuing_sequences]
    # Never accepted, still 4 each, down to what max_tokens leaves at the end.
    assert rooms[:4] == [4, 4, 4, 4] and rooms[-3:] == [2, 1, 0]
    assert len(harness.token_ids("a")) == 9


def test_the_cost_fit_starts_from_the_workers_measured_row_cost():
    assert StepCost(0.12).ratio == 0.12
    assert StepCost(0.0).ratio == StepCost.PRIOR_RATIO  # not measured
    assert StepCost(1e-9).ratio == StepCost.MIN_PRIOR  # measured free: never taken as free


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"method": "eagle", "num_speculative_tokens": 3}', "method 'eagle' is not built"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"num_speculative_tokens": 3, "lookup_max": 4}', "unknown keys \\['lookup_max'\\]"),
        ("[3]", "must be a JSON object"),
        (
            '{"num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
            "must not exceed",
        ),
    ],
)
def test_a_bad_speculative_config_is_refused_naming_the_flag(text, message):
    from scheduler_svc.config import SchedulerConfig

    with pytest.raises(ValueError, match=message):
        SchedulerConfig(speculative_config=text)


def test_lookup_bounds_default_as_vllms():
    from scheduler_svc.config.speculative import parse_speculative_config

    both = parse_speculative_config('{"num_speculative_tokens": 3}')
    assert (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    one = parse_speculative_config('{"num_speculative_tokens": 3, "prompt_lookup_max": 3}')
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (3, 3)
