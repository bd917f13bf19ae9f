"""LoRA adapters through the pool, over gRPC to fake workers that answer LoadAdapter:
a request's adapter is loaded on its worker before its first plan there, a refused
load fails the request with the worker's status, a worker lost mid-run has the request
recomputed elsewhere after the adapter loads there, and the registry's calls."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cbserve.worker.v1 import worker_pb2 as wpb
from common.errors import ServiceError
from scheduler_svc.config import FaultConfig, SchedulerConfig
from scheduler_svc.workers.pool import WorkerPool

from .grpc_fake_worker import GrpcFakeWorker
from .harness import load_tokenizer, make_request, unique_prompt
from .lora_dirs import make_adapter_dir


class LoraFakeWorker(GrpcFakeWorker):
    """Describes LoRA slots; records each load and each new sequence's slot, and checks
    that a sequence is planned on a slot only once a load into it has answered."""

    def __init__(self, slots: int = 2, refuse: str = "") -> None:
        super().__init__()
        self.slots = slots
        self.refuse = refuse  # a path containing this is refused (INVALID_ARGUMENT)
        self.events: list[tuple] = []
        self.loaded: dict[int, str] = {}
        self.delay_s = 0.02  # steps that take a little while, so a run spans several

    async def Describe(self, request, context):  # noqa: N802
        description = await super().Describe(request, context)
        description.max_cpu_loras, description.max_loras = self.slots, self.slots
        description.max_lora_rank = 16
        return description

    async def LoadAdapter(self, request, context):  # noqa: N802
        await asyncio.sleep(0.05)  # reading files takes a while: steps go on meanwhile
        if self.refuse and self.refuse in request.lora_path:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target module zz_proj missing")
        self.loaded[request.slot] = request.lora_name
        self.events.append(("load", request.slot, request.lora_name))
        return wpb.LoadAdapterReply(rank=8, target_modules=["q_proj"])

    async def UnloadAdapter(self, request, context):  # noqa: N802
        self.loaded.pop(request.slot, None)
        self.events.append(("unload", request.slot))
        return wpb.UnloadAdapterReply()

    async def Step(self, request_iterator, context):  # noqa: N802
        async def checked():
            async for plan in request_iterator:
                for sequence in plan.new_sequences:
                    slot = sequence.adapter_slot
                    assert slot == 0 or slot in self.loaded, f"slot {slot} not loaded"
                    self.events.append(("plan", sequence.seq_id, self.loaded.get(slot)))
                yield plan

        async for result in super().Step(checked(), context):
            yield result


def lora_config(tmp_path, *names: str) -> SchedulerConfig:
    modules = [f"{name}={make_adapter_dir(tmp_path, name)}" for name in names]
    return SchedulerConfig(enable_lora=True, lora_modules=modules, max_loras=2, max_cpu_loras=2)


async def drain(handle) -> object:
    """The request's last item: its final output or its error."""
    while True:
        item = await asyncio.wait_for(handle.queue.get(), 10.0)
        if isinstance(item, ServiceError) or item.finish_reason is not None:
            return item


def test_adapter_loads_before_the_first_plan_and_a_refusal_fails_the_request(tmp_path):
    async def scenario():
        worker = await LoraFakeWorker(refuse="bad").start()
        config = lora_config(tmp_path, "good", "bad")
        faults = FaultConfig(worker_timeout_s=2.0)
        pool = WorkerPool(config, tokenizer=load_tokenizer(), faults=faults)
        await pool.start([worker.address], 5.0)
        base = make_request(unique_prompt(6), max_tokens=3)
        good = make_request(unique_prompt(6), max_tokens=3)
        good.adapter = pool.adapter("good")
        bad = make_request(unique_prompt(6), max_tokens=3)
        bad.adapter = pool.adapter("bad")
        handles = [pool.submit(request) for request in (base, good, bad)]
        base_end, good_end, bad_end = [await drain(handle) for handle in handles]
        assert base_end.completion_tokens == good_end.completion_tokens == 3
        assert isinstance(bad_end, ServiceError)
        assert bad_end.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "zz_proj" in bad_end.message
        plans = {event[1]: event[2] for event in worker.events if event[0] == "plan"}
        assert plans == {base.seq_id: None, good.seq_id: "good"}
        first_plan = next(
            i for i, e in enumerate(worker.events) if e == ("plan", good.seq_id, "good")
        )
        assert worker.events.index(("load", 1, "good")) < first_plan
        await pool.stop()
        await worker.stop()

    asyncio.run(scenario())


def test_a_request_moved_off_a_lost_worker_loads_its_adapter_there_first(tmp_path):
    async def scenario():
        first, second = await LoraFakeWorker().start(), await LoraFakeWorker().start()
        faults = FaultConfig(worker_timeout_s=2.0, worker_wait_timeout_s=10.0)
        pool = WorkerPool(lora_config(tmp_path, "sql"), tokenizer=load_tokenizer(), faults=faults)
        await pool.start([first.address], 5.0)
        request = make_request(unique_prompt(6), max_tokens=40)
        request.adapter = pool.adapter("sql")
        handle = pool.submit(request)
        pool.add(second.address)  # connects in the background, after the request is placed
        for _ in range(200):
            if ("plan", request.seq_id, "sql") in first.events and len(
                pool.connected_engines()
            ) == 2:
                break
            await asyncio.sleep(0.02)
        await first.stop()
        end = await drain(handle)
        assert not isinstance(end, ServiceError), end
        assert end.completion_tokens == 40
        moved = [e for e in second.events if e[0] in ("load", "plan")]
        assert moved == [("load", 1, "sql"), ("plan", request.seq_id, "sql")]
        await pool.stop()
        await second.stop()

    asyncio.run(scenario())


def test_a_worker_without_slots_is_not_used(tmp_path):
    async def scenario():
        slotless, worker = await LoraFakeWorker(slots=0).start(), await LoraFakeWorker().start()
        pool = WorkerPool(lora_config(tmp_path), tokenizer=load_tokenizer())
        await pool.start([slotless.address, worker.address], 5.0)
        await asyncio.sleep(0.1)
        assert [e.address for e in pool.connected_engines()] == [worker.address]
        await pool.stop()
        await slotless.stop()
        await worker.stop()

    asyncio.run(scenario())


def test_load_and_unload_at_run_time(tmp_path):
    async def scenario():
        worker = await LoraFakeWorker(refuse="wrong").start()
        pool = WorkerPool(lora_config(tmp_path), tokenizer=load_tokenizer())
        await pool.start([worker.address], 5.0)
        assert pool.lora_enabled and pool.adapters() == []
        info = await pool.load_adapter("chat", str(make_adapter_dir(tmp_path, "chat")), "Base")
        assert (info.name, info.lora_id, info.base_model_name) == ("chat", 1, "Base")
        assert ("load", 1, "chat") in worker.events, "a run-time load is checked by a worker"
        with pytest.raises(ServiceError) as refused:
            await pool.load_adapter("w", str(make_adapter_dir(tmp_path, "wrong")))
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert [a.name for a in pool.adapters()] == ["chat"], "a refused adapter is not listed"
        await pool.unload_adapter("chat")
        await asyncio.sleep(0.05)
        assert ("unload", 1) in worker.events
        for call in (lambda: pool.adapter("chat"), lambda: pool.unload_adapter("chat")):
            with pytest.raises(ServiceError) as gone:
                result = call()
                if asyncio.iscoroutine(result):
                    await result
            assert gone.value.code is grpc.StatusCode.NOT_FOUND
        await pool.stop()
        await worker.stop()

    asyncio.run(scenario())


def test_an_adapter_named_with_lora_off_is_invalid():
    pool = WorkerPool(SchedulerConfig(), tokenizer=load_tokenizer())
    assert pool.adapter("") is None and not pool.lora_enabled and pool.adapters() == []
    with pytest.raises(ServiceError) as refused:
        pool.adapter("sql")
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
