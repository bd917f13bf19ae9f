"""The phases of one move with KV under async scheduling (workers/kv_moves.py): the
destination's blocks are reserved as soon as the request is parked, while the source's
plans in flight still answer into it; SendKv waits for both the source to settle and
the destination's plans sent before the reservation (one may still write a block freed
meanwhile: the worker writes arriving chunks beside its steps); a drain's move keeps the
destination one plan ahead at most until it takes the request in. Engines on harness
schedulers with two plans in flight, SendKv faked over their fake workers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers.handle import RequestHandle
from scheduler_svc.workers.kv_moves import MoveOutcome
from scheduler_svc.workers.pool import WorkerPool

from .harness import Harness, make_request, unique_prompt
from .kv_transfer_fakes import FakeSendKv
from .test_kv_moves import WORDS, _reference


class AsyncCluster:
    """Engines a and b on harness schedulers with async scheduling (two plans out)."""

    def __init__(self) -> None:
        self.pool = WorkerPool(
            SchedulerConfig(), tokenizer=None, metrics=SchedulerMetrics("fake", requests=False)
        )
        self.harness, self.engine, self.send_kv = {}, {}, {}
        for name in "ab":
            harness = Harness(async_scheduling=True)
            engine = self.pool._new_engine(name)
            engine.scheduler = harness.scheduler
            engine.client.description = SimpleNamespace(num_kv_blocks=64, block_size=4)
            engine._set_connected(True)
            self.harness[name], self.engine[name] = harness, engine
        workers = {name: harness.worker for name, harness in self.harness.items()}
        for name, engine in self.engine.items():
            self.send_kv[name] = engine.client.send_kv = FakeSendKv(workers[name], workers)

    def queue(self, name: str, request) -> RequestHandle:
        self.harness[name].add(request, tokens=WORDS)
        handle = RequestHandle(request.request_id, self.engine[name])
        self.engine[name]._handles.add(handle)
        return handle

    def answer(self, name: str) -> None:
        """The worker answers the oldest plan, and the engine notes it (the step loop's
        on_step), which wakes what waits on it."""
        self.harness[name].answer_oldest()
        self.engine[name]._step_answered()


async def _settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_reservation_comes_first_and_sendkv_waits_for_both_sides_plans_in_flight():
    async def scenario():
        cluster = AsyncCluster()
        a, b = cluster.harness["a"], cluster.harness["b"]
        prompt = unique_prompt(10)
        request = make_request(prompt=prompt, max_tokens=14)
        cluster.queue("a", request)
        cluster.queue("b", make_request(prompt=unique_prompt(10), max_tokens=30))
        for _ in range(4):
            a.step()
            b.step()
        assert a.in_flight and b.in_flight  # one plan out on each, as async keeps them
        used_on_b = b.block_manager.num_used_blocks
        move = asyncio.create_task(
            cluster.pool.kv_moves.move(
                cluster.engine["a"], request.request_id, [cluster.engine["b"]], hold_lookahead=True
            )
        )
        await _settle_tasks()
        # Reserved already, while a's plan in flight still computes for the request.
        assert b.block_manager.num_used_blocks > used_on_b
        assert b.scheduler.max_in_flight == 1  # held one plan ahead until adoption
        assert not cluster.send_kv["a"].calls
        cluster.answer("a")  # the source settles: its token taken as usual
        await _settle_tasks()
        assert not cluster.send_kv["a"].calls  # b's plan sent before the reservation is out
        cluster.answer("b")
        result = await asyncio.wait_for(move, 5)
        assert result.outcome is MoveOutcome.MOVED
        assert len(cluster.send_kv["a"].calls) == 1
        assert b.scheduler.max_in_flight == 2  # back once the request is taken in
        b.scripts[request.seq_id] = a.scripts[request.seq_id]
        b.outputs[request.request_id] = a.outputs.pop(request.request_id, [])
        b.streams[request.request_id] = a.streams.pop(request.request_id)
        b.requests[request.request_id] = request
        b.run()
        a.run()
        assert b.token_ids(request.request_id) == _reference(prompt, 14)
        assert a.block_manager.num_used_blocks == 0
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_a_request_that_ends_while_it_settles_gives_its_reservation_back():
    async def scenario():
        cluster = AsyncCluster()
        a, b = cluster.harness["a"], cluster.harness["b"]
        request = make_request(prompt=unique_prompt(10), max_tokens=4)
        cluster.queue("a", request)
        while request.num_output_tokens + request.num_pending_samples < 4:
            a.step()
        assert a.in_flight  # its last token is being sampled
        move = asyncio.create_task(
            cluster.pool.kv_moves.move(
                cluster.engine["a"], request.request_id, [cluster.engine["b"]], hold_lookahead=True
            )
        )
        await _settle_tasks()
        assert b.block_manager.num_used_blocks > 0 and b.scheduler.max_in_flight == 1
        cluster.answer("a")  # it finishes on that token: nothing to move
        result = await asyncio.wait_for(move, 5)
        assert result.outcome is MoveOutcome.GONE
        assert not cluster.send_kv["a"].calls
        assert b.block_manager.num_used_blocks == 0
        assert b.scheduler.max_in_flight == 2
        await cluster.pool.stop()

    asyncio.run(scenario())
