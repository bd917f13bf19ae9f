"""Moving a lost worker's requests to another scheduler: take_unfinished, then adopt.

The source scheduler is left empty and consistent; the requests resume on the
destination from prompt + output so far, with their own output processors,
and their clients see exactly the tokens and text of a run without the fault.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.core.request import RequestStatus
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.pool import WorkerPool

from .books import check_books
from .fake_worker import FakeWorker, scripted
from .harness import THE, Harness, encode, make_request, unique_prompt

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve")


def _add_all(harness: Harness, prompts, max_tokens=10, **sampling):
    return [
        harness.add(
            make_request(prompt=prompt, request_id=f"r{i}", max_tokens=max_tokens, **sampling),
            tokens=WORDS,
        )
        for i, prompt in enumerate(prompts)
    ]


def _prompts():
    # A long one (prefilled in chunks with a small budget) and short ones.
    return [unique_prompt(30), unique_prompt(5), unique_prompt(6), unique_prompt(9)]


def _reference(prompts, **sampling) -> tuple[dict[str, list[int]], dict[str, str]]:
    harness = Harness(max_num_batched_tokens=16)
    requests = _add_all(harness, prompts, **sampling)
    harness.run()
    ids = [r.request_id for r in requests]
    return {i: harness.token_ids(i) for i in ids}, {i: harness.text(i) for i in ids}


def _migrate(source: Harness, destination: Harness) -> list:
    taken = source.scheduler.take_unfinished()
    check_books(source.scheduler)
    assert not source.scheduler.has_unfinished_requests()
    assert source.block_manager.num_used_blocks == 0
    for request, processor in taken:
        destination.scripts[request.seq_id] = source.scripts[request.seq_id]
        destination.requests[request.request_id] = request
        destination.outputs[request.request_id] = source.outputs.pop(request.request_id, [])
        destination.scheduler.adopt(request, processor)
        check_books(destination.scheduler)
    return taken


@pytest.mark.parametrize("steps_before", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("in_flight", [False, True])
def test_moved_requests_stream_exactly_what_a_run_without_fault_streams(steps_before, in_flight):
    prompts = _prompts()
    expected_tokens, expected_text = _reference(prompts)
    source = Harness(max_num_batched_tokens=16)
    requests = _add_all(source, prompts)
    for _ in range(steps_before):
        source.step()
    if in_flight:
        assert source.schedule() is not None  # its result never comes: the worker died
    finished_before = {r.request_id for r in requests if source.finished(r.request_id)}
    destination = Harness(max_num_batched_tokens=16)
    taken = _migrate(source, destination)
    assert {r.request_id for r, _ in taken} == {r.request_id for r in requests} - finished_before
    for request, _ in taken:
        assert request.status is RequestStatus.WAITING
        assert (request.num_computed_tokens, request.seen_by_worker) == (0, False)
    destination.run()
    check_books(destination.scheduler)
    assert destination.block_manager.num_used_blocks == 0
    for request in requests:
        rid = request.request_id
        harness = source if rid in finished_before else destination
        assert harness.token_ids(rid) == expected_tokens[rid]
        assert harness.text(rid) == expected_text[rid]
        assert harness.final(rid).completion_tokens == 10


def test_a_moved_request_is_prefilled_over_its_prompt_and_output():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    for _ in range(3):
        source.step()
    assert request.num_output_tokens == 3
    destination = Harness()
    _migrate(source, destination)
    plan = destination.schedule()
    (new,) = plan.new_sequences
    assert new.seq_id == request.seq_id
    assert list(new.prompt_token_ids) == request.prompt_token_ids
    assert list(new.output_token_ids) == WORDS[:3]
    assert (new.num_computed_tokens, new.num_scheduled_tokens) == (0, 10)


def test_the_source_sends_nothing_stale_and_accepts_a_fresh_step():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    source.scheduler.abort_request("missing")  # no-op
    source.schedule()  # in flight; then the worker is lost
    _migrate(source, Harness())
    # No step in flight, no sequence to drop on a worker that is gone.
    assert source.scheduler.schedule() is None
    source.worker = FakeWorker(64, 4, scripted(source.scripts, lambda *_: THE))  # a fresh worker
    late = source.add(make_request(prompt=unique_prompt(5), max_tokens=2))
    source.run()
    assert source.finished(late.request_id)
    check_books(source.scheduler)


def test_stop_strings_and_held_back_text_survive_the_move():
    # " three" ends the request; " thr"-like partial matches are held back meanwhile.
    prompts = [unique_prompt(6), unique_prompt(8)]
    expected_tokens, expected_text = _reference(prompts, stop=[" four"])
    for steps_before in range(1, 5):
        source = Harness(max_num_batched_tokens=16)
        requests = _add_all(source, prompts, stop=[" four"])
        for _ in range(steps_before):
            source.step()
        destination = Harness(max_num_batched_tokens=16)
        _migrate(source, destination)
        destination.run()
        for request in requests:
            rid = request.request_id
            harness = destination if rid in destination.outputs else source
            assert harness.text(rid) == expected_text[rid]
            assert harness.token_ids(rid) == expected_tokens[rid]


def test_adopt_refuses_a_request_in_another_state_or_too_long_or_a_duplicate():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    ((taken, processor),) = source.scheduler.take_unfinished()
    small = Harness(max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len"):
        small.scheduler.adopt(taken, processor)
    destination = Harness()
    destination.scheduler.adopt(taken, processor)
    with pytest.raises(ValueError, match="already scheduled"):
        destination.scheduler.adopt(taken, processor)
    destination.step()
    other = Harness()
    with pytest.raises(ValueError, match="not a waiting request"):
        other.scheduler.adopt(taken, processor)
    check_books(destination.scheduler)


def test_aborting_a_moved_request_frees_it_on_the_destination():
    source = Harness()
    (request,) = _add_all(source, [unique_prompt(7)])
    source.step()
    destination = Harness()
    _migrate(source, destination)
    destination.step()
    destination.scheduler.abort_request(request.request_id)
    destination.step()
    check_books(destination.scheduler)
    assert destination.block_manager.num_used_blocks == 0


def test_preempted_requests_move_too_and_keep_their_usage():
    source = Harness(num_blocks=6, enable_prefix_caching=False)
    requests = _add_all(source, [unique_prompt(7) for _ in range(3)], max_tokens=8)
    for _ in range(4):
        source.step()
    assert sum(r.num_preemptions for r in requests) >= 1
    destination = Harness(num_blocks=64)
    _migrate(source, destination)
    destination.run()
    for request in requests:
        rid = request.request_id
        harness = destination if rid in destination.outputs else source
        assert harness.token_ids(rid) == (WORDS * 2)[:8]
        assert harness.final(rid).completion_tokens == 8


# -- the pool: where a lost worker's requests go ------------------------------------------


def _engine(pool: WorkerPool, address: str) -> tuple[WorkerEngine, Harness]:
    """A real engine on a harness's scheduler, in the pool, with no worker process."""
    harness = Harness()
    engine = WorkerEngine(
        address,
        harness.scheduler.config,
        tokenizer=None,
        on_connection_change=pool._connection_changed,
        faults=pool.faults,
        migrations=pool,
    )
    engine.scheduler = harness.scheduler
    engine.client.description = SimpleNamespace(num_kv_blocks=64, block_size=4)
    pool.engines[address] = engine
    return engine, harness


def _queue_on(engine: WorkerEngine, harness: Harness, request) -> asyncio.Queue:
    harness.add(request, tokens=WORDS)
    queue: asyncio.Queue = asyncio.Queue()
    engine._queues[request.request_id] = queue
    return queue


def _lose(pool: WorkerPool, engine: WorkerEngine) -> None:
    engine._set_connected(False)
    pool.requests_lost(engine, engine.take_migrants())


def test_lost_requests_wait_for_a_worker_then_resume_there_and_stay_reachable():
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None, faults=FaultConfig())
        a, harness_a = _engine(pool, "a")
        a._set_connected(True)
        kept = make_request(prompt=unique_prompt(7), max_tokens=10)
        gone = make_request(prompt=unique_prompt(7), max_tokens=10)
        kept_queue = _queue_on(a, harness_a, kept)
        _queue_on(a, harness_a, gone)
        harness_a.step()
        a._first_scheduled[kept.request_id] = 12.5
        _lose(pool, a)
        assert pool.num_waiting == 2 and not a.holds(kept.request_id)
        a.abort(gone.request_id)  # its client left while it waited for a worker
        assert pool.num_waiting == 1
        b, harness_b = _engine(pool, "b")
        b._set_connected(True)  # a worker connects: the waiting request goes there
        assert b.holds(kept.request_id) and pool.num_waiting == b.num_waiting == 1
        harness_b.scripts[kept.seq_id] = harness_a.scripts[kept.seq_id]
        harness_b.run()
        assert [o.new_token_ids[0] for o in harness_b.outputs[kept.request_id]] == WORDS[1:10]
        assert kept_queue.empty()  # the harness took the outputs, not the engine
        # The Generate handler still talks to the engine it started on.
        assert a.take_first_scheduled_time(kept.request_id) == 12.5
        assert a.take_first_scheduled_time(kept.request_id) is None
        late = make_request(prompt=unique_prompt(7), max_tokens=10)
        _queue_on(b, harness_b, late)
        a.abort(late.request_id)
        assert not b.holds(late.request_id) and not harness_b.scheduler.has_unfinished_requests()
        await pool.stop()

    asyncio.run(scenario())


def test_lost_requests_go_to_the_least_loaded_connected_worker():
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None)
        engines = {name: _engine(pool, name) for name in "abc"}
        for engine, _ in engines.values():
            engine._set_connected(True)
        busy, harness_busy = engines["b"]
        _queue_on(busy, harness_busy, make_request(prompt=unique_prompt(5), max_tokens=4))
        a, harness_a = engines["a"]
        requests = [make_request(prompt=unique_prompt(5), max_tokens=4) for _ in range(3)]
        for request in requests:
            _queue_on(a, harness_a, request)
        _lose(pool, a)
        c = engines["c"][0]
        assert [c.holds(r.request_id) for r in requests].count(True) == 2
        assert [busy.holds(r.request_id) for r in requests].count(True) == 1
        await pool.stop()

    asyncio.run(scenario())


def test_with_no_worker_within_the_wait_timeout_lost_requests_end_with_unavailable():
    async def scenario():
        pool = WorkerPool(
            SchedulerConfig(), tokenizer=None, faults=FaultConfig(worker_wait_timeout_s=0.1)
        )
        a, harness_a = _engine(pool, "a")
        a._set_connected(True)
        queue = _queue_on(a, harness_a, make_request(prompt=unique_prompt(5), max_tokens=4))
        harness_a.step()
        _lose(pool, a)
        assert queue.empty()
        error = await asyncio.wait_for(queue.get(), 2.0)
        assert isinstance(error, ServiceError) and error.code is grpc.StatusCode.UNAVAILABLE
        assert "--worker-wait-timeout" in error.message and pool.num_waiting == 0
        await pool.stop()

    asyncio.run(scenario())


def test_a_waiting_request_with_a_deadline_waits_until_it_not_the_wait_timeout():
    async def scenario():
        pool = WorkerPool(
            SchedulerConfig(), tokenizer=None, faults=FaultConfig(worker_wait_timeout_s=0.1)
        )
        a, harness_a = _engine(pool, "a")
        a._set_connected(True)
        assert pool.accepts_without_worker()  # a worker has described itself: limits known
        deadline = time.monotonic() + 0.6
        patient = make_request(prompt=unique_prompt(5), max_tokens=4, deadline=deadline)
        queue = _queue_on(a, harness_a, patient)
        _queue_on(a, harness_a, make_request(prompt=unique_prompt(5), max_tokens=4))
        harness_a.step()
        _lose(pool, a)
        await asyncio.sleep(0.3)  # past --worker-wait-timeout, before its deadline
        assert queue.empty() and pool.num_waiting == 1
        assert pool.accepts_without_worker()
        error = await asyncio.wait_for(queue.get(), 2.0)
        assert time.monotonic() >= deadline - 0.05
        assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED and pool.num_waiting == 0
        await pool.stop()

    asyncio.run(scenario())


def test_before_any_worker_has_connected_a_new_request_cannot_wait():
    pool = WorkerPool(SchedulerConfig(), tokenizer=None)
    assert not pool.accepts_without_worker()
