"""The pool's orphanage: where a lost worker's requests go, and how long they wait.

Real engines on harness schedulers, with no worker process: a loss is played
by taking the engine's migrants as its recovery does.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc

from common.errors import ServiceError
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import RequestHandle
from scheduler_svc.workers.pool import WorkerPool

from .harness import Harness, encode, make_request, unique_prompt

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve")


# -- the pool: where a lost worker's requests go ------------------------------------------


def _engine(pool: WorkerPool, address: str) -> tuple[WorkerEngine, Harness]:
    """A real engine on a harness's scheduler, in the pool, with no worker process."""
    harness = Harness()
    engine = pool._new_engine(address)
    engine.scheduler = harness.scheduler
    engine.client.description = SimpleNamespace(num_kv_blocks=64, block_size=4)
    return engine, harness


def _queue_on(engine: WorkerEngine, harness: Harness, request) -> RequestHandle:
    """Queues the request on the engine's scheduler, with the handle its client holds."""
    harness.add(request, tokens=WORDS)
    handle = RequestHandle(request.request_id, engine)
    engine._handles.add(handle)
    return handle


def _lose(engine: WorkerEngine) -> None:
    engine._set_connected(False)
    engine.on_requests_lost(engine.take_migrants())


def test_lost_requests_wait_for_a_worker_then_resume_there_and_stay_reachable():
    async def scenario():
        pool = WorkerPool(SchedulerConfig(), tokenizer=None, faults=FaultConfig())
        a, harness_a = _engine(pool, "a")
        a._set_connected(True)
        kept = make_request(prompt=unique_prompt(7), max_tokens=10)
        gone = make_request(prompt=unique_prompt(7), max_tokens=10)
        kept_handle = _queue_on(a, harness_a, kept)
        gone_handle = _queue_on(a, harness_a, gone)
        harness_a.step()
        kept_handle.first_scheduled = 12.5
        _lose(a)
        assert pool.num_waiting == 2 and not a.holds(kept.request_id)
        gone_handle.abort()  # its client left while it waited for a worker
        assert pool.num_waiting == 1
        b, harness_b = _engine(pool, "b")
        b._set_connected(True)  # a worker connects: the waiting request goes there
        assert b.holds(kept.request_id) and pool.num_waiting == b.num_waiting == 1
        harness_b.scripts[kept.seq_id] = harness_a.scripts[kept.seq_id]
        harness_b.streams[kept.request_id] = harness_a.streams[kept.request_id]
        harness_b.run()
        assert [o.new_token_ids[0] for o in harness_b.outputs[kept.request_id]] == WORDS[1:10]
        assert kept_handle.queue.empty()  # the harness took the outputs, not the engine
        # The Generate handler's handle followed the request: its holder is the new
        # engine, and its first-scheduled time is the one from before the move.
        assert kept_handle.holder is b and kept_handle.first_scheduled == 12.5
        late = make_request(prompt=unique_prompt(7), max_tokens=10)
        late_handle = _queue_on(b, harness_b, late)
        late_handle.abort()
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
        _lose(a)
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
        queue = _queue_on(a, harness_a, make_request(prompt=unique_prompt(5), max_tokens=4)).queue
        harness_a.step()
        _lose(a)
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
        queue = _queue_on(a, harness_a, patient).queue
        _queue_on(a, harness_a, make_request(prompt=unique_prompt(5), max_tokens=4))
        harness_a.step()
        _lose(a)
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
