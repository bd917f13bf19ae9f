"""LoadAdapter and UnloadAdapter on the worker's servicer, in process (no port), with the
Step stream that then runs sequences on the slots or refuses them."""

from __future__ import annotations

import asyncio
import json

import grpc

from bench.accuracy.eval import greedy_batch_plans
from cbserve.worker.v1 import worker_pb2 as pb
from tests.worker.conftest import build_runner
from tests.worker.lora.conftest import lora_runner
from worker_svc.lora.loading import lora_description
from worker_svc.lora.slots import LoraLimits
from worker_svc.metrics import WorkerMetrics
from worker_svc.servicer import WorkerServicer
from worker_svc.worker import Worker


class Aborted(Exception):
    pass


class _Context:
    """What the servicer uses of grpc's context; abort raises, as grpc's does."""

    def peer(self):
        return "test"

    async def abort(self, code, details):
        raise Aborted(code, details)


def call(servicer, method: str, request):
    """(reply, None) or (None, (status code, details))."""

    async def run():
        try:
            return await getattr(servicer, method)(request, _Context()), None
        except Aborted as aborted:
            return None, aborted.args

    return asyncio.run(run())


def step(servicer, plans: list[pb.StepPlan]):
    """The stream's results, and its abort (code, details) if it ended with one."""

    async def requests():
        for plan in plans:
            yield plan

    async def run():
        results = []
        try:
            async for result in servicer.Step(requests(), _Context()):
                results.append(result)
        except Aborted as aborted:
            return results, aborted.args
        return results, None

    return asyncio.run(run())


def servicer_of(runner) -> WorkerServicer:
    servicer = WorkerServicer(WorkerMetrics("test"))
    servicer.set_ready(Worker(runner, pb.WorkerDescription(), threads=1))
    return servicer


def test_describe_fields():
    assert lora_description(None) == {"max_cpu_loras": 0, "max_loras": 0, "max_lora_rank": 0}
    described = pb.WorkerDescription(**lora_description(LoraLimits(4, 2, 32)))
    assert (described.max_cpu_loras, described.max_loras, described.max_lora_rank) == (4, 2, 32)


def test_a_worker_without_lora_refuses_loads_and_slots(loaded_model, peft_adapters):
    servicer = servicer_of(build_runner(loaded_model))
    request = pb.LoadAdapterRequest(slot=1, lora_path=peft_adapters["r8-all"][0])
    _, (code, details) = call(servicer, "LoadAdapter", request)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "--enable-lora" in details
    first, _ = greedy_batch_plans([[1, 2, 3]], 1)
    first.new_sequences[0].adapter_slot = 1
    _, (code, details) = step(servicer, [first])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "without --enable-lora" in details


def test_load_run_unload(loaded_model, peft_adapters, question_ids, tmp_path):
    runner = lora_runner(loaded_model, [], num_blocks=32)  # 1 slot, rank up to 16, empty
    servicer = servicer_of(runner)
    path = peft_adapters["r16-all"][0]
    past = pb.LoadAdapterRequest(slot=2, lora_path=path)
    _, (code, details) = call(servicer, "LoadAdapter", past)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "slots are 1..1" in details
    missing = pb.LoadAdapterRequest(slot=1, lora_path=str(tmp_path / "nowhere"))
    assert call(servicer, "LoadAdapter", missing)[1][0] == grpc.StatusCode.NOT_FOUND
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 64, "lora_alpha": 64})
    )
    big = pb.LoadAdapterRequest(slot=1, lora_path=str(tmp_path / "big"))
    code, details = call(servicer, "LoadAdapter", big)[1]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "--max-lora-rank 16" in details

    first, decode = greedy_batch_plans(question_ids[:1], 4)
    first.new_sequences[0].adapter_slot = 1
    _, (code, details) = step(servicer, [first])
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "holds no adapter" in details

    loaded, error = call(servicer, "LoadAdapter", pb.LoadAdapterRequest(slot=1, lora_path=path))
    assert error is None and loaded.rank == 16 and len(loaded.target_modules) == 7
    assert loaded.load_seconds > 0
    results, error = step(servicer, [first, decode])
    assert error is None and [len(r.token_ids) for r in results] == [1, 1]

    assert call(servicer, "UnloadAdapter", pb.UnloadAdapterRequest(slot=1))[1] is None
    _, (code, _) = step(servicer, [first])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    servicer.executor.shutdown(wait=True)
