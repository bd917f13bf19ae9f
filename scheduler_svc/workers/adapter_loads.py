"""The engine's hands on its worker's LoRA slots: the loads and unloads that the
residency (core/adapter_residency.py) asks for, each an RPC task beside the steps.

A load never holds a step: the requests of the adapter simply are not planned until
the worker has answered (then the loop is woken to plan them). A refused load fails
the requests of that adapter on this worker with the worker's status and reason
(INVALID_ARGUMENT for a rank or a target module the worker cannot take, NOT_FOUND for
a path it cannot see). An answer that comes after the worker was lost updates the
old residency only: the rebuilt scheduler starts with empty slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from common.cancel_safe import cancel_and_wait
from common.errors import ServiceError
from scheduler_svc.config.lora import LoraConfig
from scheduler_svc.core.adapter_residency import AdapterResidency
from scheduler_svc.core.request import RequestError

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler
    from scheduler_svc.lora.registry import AdapterInfo
    from scheduler_svc.workers.client import WorkerClient

log = structlog.get_logger("scheduler.adapters")


def adapter_residency(lora: LoraConfig | None, description) -> AdapterResidency | None:
    """A fresh residency for a worker that described itself (WorkerDescription), with
    the lower of the scheduler's and the worker's limits; None with LoRA off."""
    if lora is None or description.max_cpu_loras == 0:
        return None
    worker_max_loras = description.max_loras or lora.max_loras
    return AdapterResidency(
        min(lora.max_cpu_loras, description.max_cpu_loras), min(lora.max_loras, worker_max_loras)
    )


def adapters_in_use(scheduler: Scheduler) -> set[int]:
    """lora_ids of the running requests, which pin their slots (core/adapter_residency)."""
    in_use = set()
    for request in scheduler.running:
        if request.adapter is not None:
            in_use.add(request.adapter.lora_id)
    return in_use


class AdapterLoads:
    def __init__(self, client: WorkerClient, wake: Callable[[], None]) -> None:
        self.client = client
        # Wakes the engine's step loop: a load answered, requests may be planned.
        self._wake = wake
        self._tasks: set[asyncio.Task] = set()
        # load_now's callers, by lora_id, until the worker answers.
        self._waiters: dict[int, list[asyncio.Future]] = {}

    def kick(self, scheduler: Scheduler | None) -> None:
        """Starts what the residency asks for now (cheap when it asks nothing: called
        after every schedule() and every request placed)."""
        residency = scheduler.adapters if scheduler is not None else None
        if residency is None or not residency.has_work:
            return
        in_use = adapters_in_use(scheduler)
        for slot, adapter in residency.start_loads(in_use):
            self._spawn(self._load(scheduler, slot, adapter), f"load {adapter.name}")
        for slot in residency.sweep_retired(in_use):
            self._spawn(self._unload(slot), f"unload slot {slot}")

    async def load_now(self, scheduler: Scheduler | None, adapter: AdapterInfo) -> None:
        """Loads the adapter on this worker ahead of any request (a load at run time is
        checked by a worker before it is answered); raises the worker's ServiceError.
        Returns at once where it is held already or no slot is free of requests."""
        residency = scheduler.adapters if scheduler is not None else None
        if residency is None or residency.holds(adapter.lora_id):
            return
        residency.want(adapter)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(adapter.lora_id, []).append(waiter)
        self.kick(scheduler)
        if adapter.lora_id in residency.wanted:  # every slot in use: checked at first use
            del residency.wanted[adapter.lora_id]
            self._waiters.pop(adapter.lora_id, None)
            return
        await waiter

    def retire(self, scheduler: Scheduler | None, lora_id: int) -> None:
        """The registry unloaded the adapter: evicted here once nothing uses it."""
        if scheduler is not None and scheduler.adapters is not None:
            scheduler.adapters.retire(lora_id)
            self.kick(scheduler)

    def _spawn(self, work, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=f"{name} on {self.client.address}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, scheduler: Scheduler, slot: int, adapter: AdapterInfo) -> None:
        try:
            reply = await self.client.load_adapter(slot, adapter)
        except ServiceError as error:
            log.warning(
                "LoRA adapter load refused",
                worker=self.client.address,
                adapter=adapter.name,
                code=error.code.name,
                reason=error.message,
            )
            scheduler.adapters.load_failed(adapter.lora_id)
            self._fail_requests(scheduler, adapter.lora_id, error)
            self._answer(adapter.lora_id, error)
        else:
            log.info(
                "LoRA adapter loaded",
                worker=self.client.address,
                adapter=adapter.name,
                slot=slot,
                seconds=round(reply.load_seconds, 3),
            )
            scheduler.adapters.loaded(adapter.lora_id)
            self._answer(adapter.lora_id, None)
        self._wake()
        self.kick(scheduler)

    def _answer(self, lora_id: int, error: ServiceError | None) -> None:
        for waiter in self._waiters.pop(lora_id, ()):
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    async def _unload(self, slot: int) -> None:
        try:
            await self.client.unload_adapter(slot)
        except ServiceError as error:
            # Harmless: the slot is free in the scheduler's books, and a load over it
            # replaces what it holds.
            log.warning("LoRA adapter unload failed", worker=self.client.address, reason=str(error))

    def _fail_requests(self, scheduler: Scheduler, lora_id: int, error: ServiceError) -> None:
        failure = RequestError(error.code, error.message)
        for request in (*scheduler.waiting, *scheduler.running):
            if request.adapter is not None and request.adapter.lora_id == lora_id:
                scheduler.requests.fail(request, failure)

    async def stop(self) -> None:
        for task in list(self._tasks):
            await cancel_and_wait(task)
