"""Adapters into a running worker: the slot store at start, and LoadAdapter/UnloadAdapter.

A load reads and checks the directory on a thread of its own (asyncio.to_thread), beside
the steps, and only then writes the slot, on the forward thread between two steps and
under the runner's lock (the servicer's `runner_lock`, which every step holds too: a
small plan may run on the event loop's thread instead of the forward thread). So no step
reads a half-written slot, and a load holds the running batch for the copy only (a few
milliseconds), never for the read. The scheduler plans a sequence on a slot only after
its load answered, and loads over or unloads a slot only when no sequence uses it
(worker.proto); the plan reader refuses a sequence on an empty slot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import grpc
import structlog

from cbserve.worker.v1 import worker_pb2
from worker_svc.errors import AdapterError, AdapterNotFoundError

if TYPE_CHECKING:
    from worker_svc.lora.limits import LoraLimits
    from worker_svc.lora.slots import LoraSlots
    from worker_svc.model_runner import ModelRunner
    from worker_svc.worker import Worker

log = structlog.get_logger("worker_svc.lora")


def enable_lora(runner: ModelRunner, limits: LoraLimits) -> LoraSlots:
    """Builds the slot store for the runner's model, hands it to the model's layers and
    to the runner (and its plan reader); ValueError where the model cannot add deltas."""
    from dataclasses import replace

    from worker_svc.lora.delta import build_slots

    slots = build_slots(runner.loaded, limits)
    runner.lora_slots = slots
    runner.reader = replace(runner.reader, lora_slots=slots)
    return slots


def lora_description(limits: LoraLimits | None) -> dict[str, int]:
    """WorkerDescription's LoRA fields: all 0 on a worker without --enable-lora."""
    if limits is None:
        return {"max_cpu_loras": 0, "max_loras": 0, "max_lora_rank": 0}
    return {
        "max_cpu_loras": limits.max_cpu_loras,
        "max_loras": limits.max_loras,
        "max_lora_rank": limits.max_lora_rank,
    }


class AdapterService:
    """The servicer's LoadAdapter and UnloadAdapter: `executor` is the forward thread,
    `runner_lock` the lock every step holds."""

    def __init__(self, executor: Executor, runner_lock: threading.Lock):
        self.executor = executor
        self.runner_lock = runner_lock

    async def load(self, worker: Worker, request, context) -> worker_pb2.LoadAdapterReply:
        slots = await _slots(worker, request.slot, context)
        from worker_svc.lora.peft_reader import read_peft_adapter

        started = time.perf_counter()
        try:
            adapter = await asyncio.to_thread(read_peft_adapter, request.lora_path, slots)
        except AdapterNotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except AdapterError as exc:
            log.warning("adapter_refused", lora_name=request.lora_name, error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        await self._between_steps(slots.write, request.slot, adapter.weights, adapter.scaling)
        seconds = time.perf_counter() - started
        log.info(
            "adapter_loaded",
            slot=request.slot,
            lora_id=request.lora_id,
            lora_name=request.lora_name,
            rank=adapter.rank,
            target_modules=list(adapter.target_modules),
            seconds=round(seconds, 3),
        )
        return worker_pb2.LoadAdapterReply(
            rank=adapter.rank, target_modules=adapter.target_modules, load_seconds=seconds
        )

    async def unload(self, worker: Worker, request, context) -> worker_pb2.UnloadAdapterReply:
        slots = await _slots(worker, request.slot, context)
        await self._between_steps(slots.clear, request.slot)
        log.info("adapter_unloaded", slot=request.slot)
        return worker_pb2.UnloadAdapterReply()

    async def _between_steps(self, write, *args) -> None:
        """Runs `write` on the forward thread, after the plans queued there, holding the
        lock a plan run on the event loop's thread holds too."""

        def locked() -> None:
            with self.runner_lock:
                write(*args)

        await asyncio.get_running_loop().run_in_executor(self.executor, locked)


async def _slots(worker: Worker, slot: int, context) -> LoraSlots:
    slots = getattr(worker.runner, "lora_slots", None)
    if slots is None:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this worker was started without --enable-lora: it holds no adapters",
        )
    try:
        slots.check_slot(slot)
    except ValueError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    return slots
