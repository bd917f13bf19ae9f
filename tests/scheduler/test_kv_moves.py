"""Moves with KV between real engines (workers/kv_moves.py) and a pool's drain
(workers/drain.py): engines on harness schedulers with no worker process, their
SendKv faked over the harnesses' fake worker pools (succeeding or failing on demand)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.api.request_trace import RequestTrace
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.workers.engine import WorkerEngine
from scheduler_svc.workers.handle import RequestHandle
from scheduler_svc.workers.kv_moves import MoveOutcome
from scheduler_svc.workers.pool import WorkerPool

from .harness import Harness, encode, make_request, unique_prompt
from .kv_transfer_fakes import FAKE_BYTES_PER_TOKEN, FakeSendKv

WORDS = encode(" one two three four five six seven eight nine ten eleven twelve thirteen")


class Cluster:
    """A pool of engines named a, b, ... on harness schedulers, each with a fake SendKv."""

    def __init__(self, names: str = "ab") -> None:
        self.metrics = SchedulerMetrics("fake", requests=False)
        self.pool = WorkerPool(SchedulerConfig(), tokenizer=None, metrics=self.metrics)
        self.harness: dict[str, Harness] = {}
        self.engine: dict[str, WorkerEngine] = {}
        workers = {}
        for name in names:
            harness = Harness()
            engine = self.pool._new_engine(name)
            engine.scheduler = harness.scheduler
            engine.client.description = SimpleNamespace(num_kv_blocks=64, block_size=4)
            engine._set_connected(True)
            self.harness[name], self.engine[name] = harness, engine
            workers[name] = harness.worker
        self.send_kv = {}
        for name, engine in self.engine.items():
            fake = FakeSendKv(self.harness[name].worker, workers)
            engine.client.send_kv = fake
            self.send_kv[name] = fake

    def queue(self, name: str, request) -> RequestHandle:
        self.harness[name].add(request, tokens=WORDS)
        handle = RequestHandle(request.request_id, self.engine[name])
        self.engine[name]._handles.add(handle)
        return handle

    def follow(self, request, source: str, destination: str) -> None:
        """The client's side of the stream follows the request (the handle does that
        in the service; the harness keeps its own outputs and text)."""
        a, b = self.harness[source], self.harness[destination]
        b.scripts[request.seq_id] = a.scripts[request.seq_id]
        b.outputs[request.request_id] = a.outputs.pop(request.request_id, [])
        b.streams[request.request_id] = a.streams.pop(request.request_id)
        b.requests[request.request_id] = request

    def sample(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name, {"model_name": "fake"}) or 0.0


def _reference(prompt, max_tokens: int) -> list[int]:
    alone = Harness()
    request = alone.add(make_request(prompt=prompt, max_tokens=max_tokens), tokens=WORDS)
    alone.run()
    return alone.token_ids(request.request_id)


def test_a_move_hands_the_request_and_its_stream_to_the_destination_with_its_kv():
    async def scenario():
        cluster = Cluster()
        prompt = unique_prompt(10)
        request = make_request(prompt=prompt, max_tokens=12)
        handle = cluster.queue("a", request)
        for _ in range(4):
            cluster.harness["a"].step()
        num_tokens = request.num_computed_tokens
        result = await cluster.pool.kv_moves.move(
            cluster.engine["a"], request.request_id, [cluster.engine["b"]]
        )
        assert result.outcome is MoveOutcome.MOVED and result.num_tokens == num_tokens
        assert result.num_bytes == num_tokens * FAKE_BYTES_PER_TOKEN
        (call,) = cluster.send_kv["a"].calls
        assert call[1] == "b" and call[4] == num_tokens
        assert handle.holder is cluster.engine["b"] and cluster.engine["b"].holds(
            request.request_id
        )
        assert not cluster.engine["a"].holds(request.request_id)
        assert handle.moved_from == ["a"]  # in the request's trace (request_trace.py)
        assert cluster.harness["a"].block_manager.num_used_blocks == 0
        cluster.follow(request, "a", "b")
        cluster.harness["b"].run()
        cluster.harness["a"].run()  # the source tells its worker to drop the sequence
        assert request.seq_id not in cluster.harness["a"].worker.sequences
        assert cluster.harness["b"].token_ids(request.request_id) == _reference(prompt, 12)
        assert cluster.harness["b"].block_manager.num_used_blocks == 0
        assert cluster.sample("cbserve_kv_transfer_tokens_total") == num_tokens
        assert cluster.sample("cbserve_kv_transfer_blocks_total") == len(call[2])
        moved = {"model_name": "fake", "outcome": "moved"}
        assert cluster.metrics.registry.get_sample_value("cbserve_kv_transfers_total", moved) == 1
        await cluster.pool.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_failed_transfer_frees_both_sides_and_recomputes_the_request(code):
    async def scenario():
        cluster = Cluster()
        prompt = unique_prompt(10)
        request = make_request(prompt=prompt, max_tokens=12)
        handle = cluster.queue("a", request)
        for _ in range(4):
            cluster.harness["a"].step()
        cluster.send_kv["a"].fail_with = code
        cluster.engine["a"].draining = True  # as a drain does: recomputed elsewhere
        result = await cluster.pool.kv_moves.move(
            cluster.engine["a"], request.request_id, [cluster.engine["b"]]
        )
        assert result.outcome is MoveOutcome.RECOMPUTED
        # No block held on either side: the reservation freed, the source's hold too.
        assert cluster.harness["a"].block_manager.num_used_blocks == 0
        assert cluster.harness["b"].block_manager.num_used_blocks == 0
        # Recomputed through the orphanage on the worker left: the stream goes on.
        assert handle.holder is cluster.engine["b"] and request.num_computed_tokens == 0
        cluster.follow(request, "a", "b")
        cluster.harness["b"].run()
        assert cluster.harness["b"].token_ids(request.request_id) == _reference(prompt, 12)
        failed = {"model_name": "fake", "outcome": "failed"}
        assert cluster.metrics.registry.get_sample_value("cbserve_kv_transfers_total", failed) == 1
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_a_client_that_leaves_during_the_transfer_is_dropped_on_both_sides():
    async def scenario():
        cluster = Cluster()
        request = make_request(prompt=unique_prompt(10), max_tokens=12)
        handle = cluster.queue("a", request)
        for _ in range(3):
            cluster.harness["a"].step()
        real = cluster.send_kv["a"]

        async def leaving(*args):
            handle.abort()  # the client goes while its KV is on the wire
            return await real(*args)

        cluster.engine["a"].client.send_kv = leaving
        result = await cluster.pool.kv_moves.move(
            cluster.engine["a"], request.request_id, [cluster.engine["b"]]
        )
        assert result.outcome is MoveOutcome.GONE
        assert not cluster.engine["b"].holds(request.request_id)
        assert cluster.harness["a"].block_manager.num_used_blocks == 0
        assert cluster.harness["b"].block_manager.num_used_blocks == 0
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_drain_moves_running_requests_requeues_waiting_ones_and_places_nothing_there():
    async def scenario():
        cluster = Cluster("abc")
        prompts = [unique_prompt(8) for _ in range(6)]
        requests = [make_request(prompt=p, max_tokens=10) for p in prompts]
        for request in requests:
            cluster.queue("a", request)
        cluster.harness["a"].step()
        cluster.harness["a"].step()
        prompts.append(unique_prompt(8))
        waiting = make_request(prompt=prompts[-1], max_tokens=10)
        cluster.queue("a", waiting)
        counts = await cluster.pool.drain("a")
        assert counts.requests_moved == 6 and counts.requests_recomputed == 0
        assert counts.requests_requeued == 1 and counts.tokens_not_recomputed > 0
        assert cluster.harness["a"].block_manager.num_used_blocks == 0
        assert cluster.engine["a"].draining and cluster.engine["a"].load == 0
        assert cluster.sample("cbserve_requests_drained_total") == 7
        # A static worker is not in the pool's static set here: dropped as discovered.
        assert "a" not in cluster.pool.engines
        requests.append(waiting)
        for request in requests:
            destination = "b" if cluster.engine["b"].holds(request.request_id) else "c"
            cluster.follow(request, "a", destination)
        for name in "bc":
            cluster.harness[name].run()
        for request, prompt in zip(requests, prompts, strict=True):
            tokens = [
                cluster.harness[n].token_ids(request.request_id)
                for n in "bc"
                if request.request_id in cluster.harness[n].outputs
            ]
            assert tokens == [_reference(prompt, 10)]
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_drain_refuses_an_unknown_worker_and_the_only_one():
    async def scenario():
        cluster = Cluster("a")
        with pytest.raises(ServiceError) as unknown:
            await cluster.pool.drain("nowhere:1")
        assert unknown.value.code is grpc.StatusCode.NOT_FOUND
        with pytest.raises(ServiceError) as only:
            await cluster.pool.drain("a")
        assert only.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert not cluster.engine["a"].draining
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_a_drained_static_worker_stays_connected_and_out_of_placement():
    async def scenario():
        cluster = Cluster()
        cluster.pool._static.add("a")
        await cluster.pool.drain("a")
        assert "a" in cluster.pool.engines and cluster.engine["a"].connected
        assert cluster.pool.placeable_engines() == [cluster.engine["b"]]
        for _ in range(3):
            handle = cluster.pool.submit(make_request(prompt=unique_prompt(5), max_tokens=2))
            assert handle.holder is cluster.engine["b"]
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_a_worker_removed_from_discovery_is_drained_not_failed():
    async def scenario():
        cluster = Cluster()
        prompt = unique_prompt(10)
        request = make_request(prompt=prompt, max_tokens=12)
        handle = cluster.queue("a", request)
        for _ in range(3):
            cluster.harness["a"].step()
        await cluster.pool.remove("a")
        assert "a" not in cluster.pool.engines and handle.holder is cluster.engine["b"]
        assert handle.queue.empty()  # no UNAVAILABLE: its stream goes on
        cluster.follow(request, "a", "b")
        cluster.harness["b"].run()
        assert cluster.harness["b"].token_ids(request.request_id) == _reference(prompt, 12)
        assert cluster.sample("cbserve_kv_transfer_tokens_total") > 0
        await cluster.pool.stop()

    asyncio.run(scenario())


def test_the_request_trace_names_the_workers_a_request_left_with_its_kv(capsys):
    trace = RequestTrace(SchedulerMetrics("fake", engine=False))
    trace.placed("b", 5)
    trace.finished("length")
    assert "kv_moved_from" not in capsys.readouterr().out
    trace = RequestTrace(SchedulerMetrics("fake", engine=False))
    trace.placed("b", 5)
    trace.moved_from = ["a"]
    trace.finished("length")
    line = capsys.readouterr().out
    assert "kv_moved_from" in line and ("'a'" in line or '"a"' in line)
