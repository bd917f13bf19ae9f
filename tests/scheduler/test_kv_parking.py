"""Moving a running request with its KV between two schedulers (core/parking.py), each
with its fake worker: park, settle (the plan in flight answered into it), detach, reserve,
the KV copied as a transfer would, adopt; the stream goes on token-identical, the
destination computes only the last sampled token, and both pools end empty."""

from __future__ import annotations

import pytest

from scheduler_svc.core import handover, parking
from scheduler_svc.core.request import RequestStatus

from .harness import Harness, encode, make_request, unique_prompt
from .kv_transfer_fakes import copy_kv
from .test_lora_scheduling import A, add, lora_harness, run_with_loads

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve thirteen")


def _move_stream(request, source: Harness, destination: Harness) -> None:
    """The client's side follows the request, as its handle does in the engine."""
    destination.scripts[request.seq_id] = source.scripts[request.seq_id]
    destination.outputs[request.request_id] = source.outputs.pop(request.request_id, [])
    destination.streams[request.request_id] = source.streams.pop(request.request_id)
    destination.requests[request.request_id] = request


def _seq_ids(plan) -> set[int]:
    return {s.seq_id for s in (*plan.new_sequences, *plan.continuing_sequences)}


def _reference(prompt, **sampling) -> list[int]:
    alone = Harness(async_scheduling=True)
    request = alone.add(make_request(prompt=prompt, **sampling), tokens=WORDS)
    alone.run()
    return alone.token_ids(request.request_id)


@pytest.mark.parametrize("steps_before", [1, 3, 6])
def test_a_request_moved_with_its_kv_goes_on_token_identical_and_frees_both_pools(steps_before):
    prompt = unique_prompt(9)
    expected = _reference(prompt, max_tokens=12)
    a, b = Harness(async_scheduling=True), Harness(async_scheduling=True)
    other = a.add(make_request(prompt=unique_prompt(6), max_tokens=12), tokens=WORDS)
    request = a.add(make_request(prompt=prompt, max_tokens=12), tokens=WORDS)
    for _ in range(steps_before):
        a.step()
    assert a.in_flight and parking.settled(a.scheduler, request) is False
    parking.park(a.scheduler, request)
    # The plan in flight answers into it (its token taken), and no new plan includes it;
    # the other request keeps decoding on the source.
    a.step()
    assert all(request.seq_id not in _seq_ids(plan) for plan in a.in_flight)
    while not parking.settled(a.scheduler, request):
        a.step()
    assert request.num_pending_samples == 0 and request.status is RequestStatus.RUNNING
    num_tokens = request.num_computed_tokens
    assert num_tokens == request.num_tokens - 1  # every token but the last sampled one
    hold = parking.detach(a.scheduler, request)
    assert hold.num_tokens == num_tokens and request.request_id not in a.scheduler.requests
    destination_ids = parking.reserve(b.scheduler, request, num_tokens)
    assert destination_ids is not None and len(destination_ids) == len(hold.block_ids)
    copy_kv(a.worker, b.worker, hold.block_ids, destination_ids, num_tokens)
    parking.release_hold(a.scheduler, request)
    _move_stream(request, a, b)
    parking.adopt_with_kv(b.scheduler, request, num_tokens)
    written = b.worker.num_slots_written
    plan = b.step()
    (new,) = plan.new_sequences
    assert new.num_computed_tokens == num_tokens and new.num_scheduled_tokens == 1
    assert new.output_token_ids == request.output_token_ids[: len(new.output_token_ids)]
    assert b.worker.num_slots_written == written + 1  # only the last sampled token
    b.run()
    a.run()
    assert b.token_ids(request.request_id) == expected
    assert b.final(request.request_id).finish_reason is not None
    assert a.finished(other.request_id)
    # The source's worker dropped the sequence; neither pool holds a block.
    assert request.seq_id not in a.worker.sequences
    assert a.block_manager.num_used_blocks == 0 and b.block_manager.num_used_blocks == 0


def test_a_failed_transfer_frees_the_reservation_and_the_request_recomputes_identically():
    prompt = unique_prompt(9)
    expected = _reference(prompt, max_tokens=10)
    a, b = Harness(async_scheduling=True), Harness(async_scheduling=True)
    request = a.add(make_request(prompt=prompt, max_tokens=10), tokens=WORDS)
    for _ in range(4):
        a.step()
    parking.park(a.scheduler, request)
    while not parking.settled(a.scheduler, request):
        a.step()
    parking.detach(a.scheduler, request)
    assert parking.reserve(b.scheduler, request, request.num_computed_tokens) is not None
    assert b.block_manager.num_used_blocks > 0
    # The transfer failed: both sides let go, the request is handed over by recompute.
    parking.release_reservation(b.scheduler, request)
    parking.release_hold(a.scheduler, request)
    assert b.block_manager.num_used_blocks == 0 and a.block_manager.num_used_blocks == 0
    handover.reset_for_recompute(request)
    b.adopt(request, a)
    b.run()
    assert b.token_ids(request.request_id) == expected


def test_a_request_that_finishes_in_the_plan_in_flight_is_not_moved():
    a = Harness(async_scheduling=True)
    request = a.add(make_request(prompt=unique_prompt(5), max_tokens=3), tokens=WORDS)
    while request.num_output_tokens < 2:
        a.step()
    parking.park(a.scheduler, request)
    a.run()
    assert a.finished(request.request_id) and request.status is RequestStatus.FINISHED
    parking.unpark(a.scheduler, request)  # a no-op: it has finished
    assert request not in a.scheduler.running and a.block_manager.num_used_blocks == 0


def test_reserve_refuses_without_room_and_unpark_plans_the_request_again():
    a, small = Harness(async_scheduling=True), Harness(num_blocks=3, block_size=4)
    request = a.add(make_request(prompt=unique_prompt(12), max_tokens=8), tokens=WORDS)
    for _ in range(3):
        a.step()
    parking.park(a.scheduler, request)
    while not parking.settled(a.scheduler, request):
        a.step()
    assert parking.reserve(small.scheduler, request, request.num_computed_tokens) is None
    assert small.block_manager.num_used_blocks == 0
    parking.unpark(a.scheduler, request)
    a.run()
    assert a.token_ids(request.request_id) == WORDS[:8]
    with pytest.raises(ValueError):
        parking.park(a.scheduler, request)  # finished: not running any more


def test_a_request_with_a_lora_adapter_moves_and_runs_once_its_adapter_is_loaded_there():
    source = lora_harness(num_slots=2, max_loras=2)
    destination = lora_harness(num_slots=2, max_loras=2)
    request = add(source, A, unique_prompt(9), WORDS[:12])
    run_with_loads(source, max_steps=5, until_idle=False)
    assert request.num_output_tokens > 0 and source.residency.is_ready(A.lora_id)
    parking.park(source.scheduler, request)
    hold = parking.detach(source.scheduler, request)
    ids = parking.reserve(destination.scheduler, request, hold.num_tokens)
    copy_kv(source.worker, destination.worker, hold.block_ids, ids, hold.num_tokens)
    parking.release_hold(source.scheduler, request)
    _move_stream(request, source, destination)
    parking.adopt_with_kv(destination.scheduler, request, hold.num_tokens)
    assert not destination.residency.is_ready(A.lora_id)
    # run_with_loads checks that its NewSequence comes only once A is loaded there,
    # with A's slot.
    run_with_loads(destination, load_steps=3)
    assert destination.token_ids(request.request_id) == WORDS[:12]
    assert destination.block_manager.num_used_blocks == 0
    assert source.block_manager.num_used_blocks == 0


def test_a_request_parked_for_a_move_that_finishes_first_is_not_kept_listed():
    import asyncio

    from scheduler_svc.workers.engine import WorkerEngine

    a = Harness(async_scheduling=True)
    request = a.add(make_request(prompt=unique_prompt(5), max_tokens=3), tokens=WORDS)
    while request.num_output_tokens < 2:
        a.step()
    engine = WorkerEngine("w", a.scheduler.config, tokenizer=None)
    engine.scheduler = a.scheduler
    assert engine.park_now(request.request_id)
    a.run()  # the plan in flight gives its last token
    assert request.status is RequestStatus.FINISHED
    assert asyncio.run(engine.detach(request.request_id)) is None
    # Not listed as parked any more: a later move of the same id finds nothing.
    assert engine.parked_for_move(request.request_id) is None
