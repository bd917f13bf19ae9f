"""Async scheduling: the next plan goes out before the last one's result is read.

The fake worker runs each plan when it is sent, in order, as a real worker does
while the scheduler is still busy with the result before; the harness applies
the oldest result only once the next plan is out. Every client must see exactly
what one plan at a time gives it, whatever happens while two plans are in flight:
a stop, an abort, a preemption, a lost worker.
"""

from __future__ import annotations

from common.plan_sequences import continuing_sequences
from scheduler_svc.core.request import FinishReason

from .books import check_books
from .harness import EOS, Harness, encode, make_request, unique_prompt

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve")


def _run_both(build, **config):
    """Runs the same requests with one plan at a time and with two in flight; returns
    both harnesses and their token ids, request by request in the order built."""
    runs = []
    for async_scheduling in (False, True):
        harness = Harness(async_scheduling=async_scheduling, **config)
        requests = build(harness)
        harness.run()
        check_books(harness.scheduler)
        assert harness.worker.sequences == {} and harness.block_manager.num_used_blocks == 0
        runs.append((harness, [(r.request_id, harness.token_ids(r.request_id)) for r in requests]))
    return runs


def test_the_next_plan_is_out_before_the_result_and_decodes_the_pending_token():
    harness = Harness(async_scheduling=True)
    request = harness.add(make_request(prompt=4, max_tokens=5), tokens=WORDS)
    prefill = harness.scheduler.schedule()
    harness.send(prefill)
    decode = harness.scheduler.schedule()  # before the prefill's token is known
    assert [s.num_scheduled_tokens for s in decode.continuing_sequences] == [1]
    assert request.num_pending_samples == 2 and request.num_output_tokens == 0
    harness.send(decode)
    harness.answer_oldest()
    assert request.output_token_ids == WORDS[:1] and request.num_pending_samples == 1
    harness.run()
    assert harness.token_ids(request.request_id) == WORDS[:5]


def test_outputs_equal_one_plan_at_a_time_with_chunks_stops_and_limits():
    def build(harness):
        return [
            harness.add(make_request(prompt=unique_prompt(30), max_tokens=9), tokens=WORDS),
            harness.add(make_request(prompt=5, max_tokens=12), tokens=[*WORDS[:3], EOS]),
            harness.add(make_request(prompt=6, max_tokens=4, stop=[" three"]), tokens=WORDS),
            harness.add(make_request(prompt=7, max_tokens=1), tokens=WORDS),
        ]

    (sync, sync_tokens), (pipelined, async_tokens) = _run_both(build, max_num_batched_tokens=16)
    assert [tokens for _, tokens in async_tokens] == [tokens for _, tokens in sync_tokens]
    for (async_id, _), (sync_id, _) in zip(async_tokens, sync_tokens, strict=True):
        assert pipelined.text(async_id) == sync.text(sync_id)
        assert pipelined.final(async_id).finish_reason is sync.final(sync_id).finish_reason


def test_a_stop_costs_one_dropped_token_and_max_tokens_costs_none():
    harness = Harness(async_scheduling=True)
    stopped = harness.add(make_request(prompt=4, max_tokens=10), tokens=[*WORDS[:2], EOS])
    limited = harness.add(make_request(prompt=4, max_tokens=3), tokens=WORDS)
    harness.run()
    assert harness.token_ids(stopped.request_id) == [*WORDS[:2], EOS]
    assert harness.final(stopped.request_id).finish_reason is FinishReason.STOP
    assert harness.token_ids(limited.request_id) == WORDS[:3]
    planned = {stopped.seq_id: 0, limited.seq_id: 0}
    for plan in harness.worker.plans:
        for seq_id in [s.seq_id for s in plan.new_sequences]:
            planned[seq_id] += 1
        for seq_id, _, _ in continuing_sequences(plan):
            planned[seq_id] += 1
    # One plan per token, plus one past the EOS (computed, sampled, dropped) for the
    # stopped one; none past max_tokens for the other.
    assert planned == {stopped.seq_id: 3 + 1, limited.seq_id: 3}


def test_an_abort_with_two_plans_in_flight_drops_their_tokens_and_frees_the_blocks():
    harness = Harness(async_scheduling=True)
    request = harness.add(make_request(prompt=4, max_tokens=10), tokens=WORDS)
    other = harness.add(make_request(prompt=5, max_tokens=4), tokens=WORDS)
    harness.step()
    harness.step()
    assert len(harness.in_flight) == 1
    harness.send(harness.scheduler.schedule())
    delivered = len(harness.token_ids(request.request_id))
    harness.scheduler.abort_request(request.request_id)
    assert not harness.block_manager.has_blocks(request.seq_id)
    harness.run()
    assert len(harness.token_ids(request.request_id)) == delivered  # nothing after the abort
    assert harness.token_ids(other.request_id) == WORDS[:4]
    assert harness.worker.sequences == {} and harness.block_manager.num_used_blocks == 0


def test_preemption_with_plans_in_flight_streams_what_a_run_without_it_streams():
    def build(harness):
        return [
            harness.add(make_request(prompt=unique_prompt(6), max_tokens=10), tokens=WORDS)
            for _ in range(3)
        ]

    small_pool = {"num_blocks": 9, "block_size": 4, "enable_prefix_caching": False}
    (sync, sync_tokens), (pipelined, async_tokens) = _run_both(build, **small_pool)
    assert pipelined.scheduler.stats.num_preemptions > 0
    assert [tokens for _, tokens in async_tokens] == [WORDS[:10]] * 3
    assert [tokens for _, tokens in sync_tokens] == [WORDS[:10]] * 3


def test_a_worker_lost_with_two_plans_in_flight_loses_no_token_on_another():
    source = Harness(async_scheduling=True, max_num_batched_tokens=16)
    requests = [
        source.add(make_request(prompt=unique_prompt(n), max_tokens=8), tokens=WORDS)
        for n in (20, 5, 7)
    ]
    for _ in range(4):
        source.step()
    source.send(source.scheduler.schedule())
    assert len(source.in_flight) == 2
    taken = source.scheduler.take_unfinished()
    source.in_flight.clear()  # the worker and its answers are gone
    assert not source.scheduler.has_unfinished_requests()
    destination = Harness(async_scheduling=True, max_num_batched_tokens=16)
    for request in taken:
        assert request.num_pending_samples == 0 and request.num_computed_tokens == 0
        destination.adopt(request, source)
    destination.run()
    for request in requests:
        outputs = destination.outputs[request.request_id] or source.outputs[request.request_id]
        assert [t for output in outputs for t in output.new_token_ids] == WORDS[:8]
