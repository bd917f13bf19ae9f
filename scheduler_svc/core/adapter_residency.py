"""Which LoRA adapters one worker holds, in which slots: the scheduler owns them as it
owns block ids (the worker's Worker.LoadAdapter loads into the slot it is given).

Slots are 1..num_slots (the worker's max_cpu_loras, or the scheduler's if lower;
slot 0 is the base model). An adapter is `wanted` when a request of it enters this
worker and no slot holds or loads it; the engine starts the loads (start_loads) beside
the steps and reports each answer (loaded / load_failed). A request is planned only
once its adapter is loaded, and a step holds at most max_loras distinct adapters
(StepAdapters). A slot is given to another adapter only when no running request on
this worker uses the one it holds, least recently planned first (a waiting request
does not pin a slot: else the waiting requests of resident adapters could hold every
slot against an older request of another adapter, the queue stopped at it); an
adapter unloaded from the registry (retire) leaves its slot once nothing runs on it.

Plain bookkeeping, no I/O. Base-model requests never reach it: every check here is
per adapter in a step, not per request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler_svc.core.request import Request
    from scheduler_svc.lora.registry import AdapterInfo


class AdapterResidency:
    def __init__(self, num_slots: int, max_loras: int) -> None:
        if num_slots < 1 or max_loras < 1:
            raise ValueError(f"need slots and max_loras >= 1, got {num_slots}, {max_loras}")
        self.num_slots = num_slots
        self.max_loras = min(max_loras, num_slots)
        # lora_id -> slot, loaded or loading.
        self._slot_of: dict[int, int] = {}
        self._ready: set[int] = set()
        # Loaded adapters by when a step last planned them, oldest first (eviction order).
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._free = list(range(num_slots, 0, -1))  # pop() gives slot 1 first
        # Needed here, no load started: lora_id -> (adapter, whether it may evict),
        # oldest wish first.
        self.wanted: dict[int, tuple[AdapterInfo, bool]] = {}
        # Loaded since the last step was planned: not evicted before its requests had
        # a chance to run (else two adapters' wishes could evict each other forever).
        self._fresh: set[int] = set()
        # Unloaded from the registry, still in a slot: evicted once nothing uses them.
        self.retired: set[int] = set()

    # -- what the scheduler reads ---------------------------------------------------------

    def is_ready(self, lora_id: int) -> bool:
        return lora_id in self._ready

    def holds(self, lora_id: int) -> bool:
        """Loaded or loading here (placement prefers such a worker)."""
        return lora_id in self._slot_of

    def slot(self, lora_id: int) -> int:
        return self._slot_of[lora_id]

    @property
    def loaded_ids(self) -> set[int]:
        return set(self._ready)

    def want(self, adapter: AdapterInfo, evict: bool = True) -> None:
        """A request needs `adapter` here. evict=False (a request entering the worker,
        a prefetch): only into a free slot; True (admission has reached the request):
        over the least recently planned unused adapter too."""
        if adapter.lora_id in self._slot_of:
            return
        known = self.wanted.get(adapter.lora_id)
        if known is None or (evict and not known[1]):
            self.wanted[adapter.lora_id] = (adapter, evict)

    def touch(self, lora_ids: Iterable[int]) -> None:
        """A step planned these: they are the last to be evicted."""
        for lora_id in lora_ids:
            self._lru.move_to_end(lora_id)
        self._fresh.clear()

    @property
    def has_work(self) -> bool:
        """Whether start_loads or sweep_retired could do anything (cheap: checked
        after every step)."""
        return bool(self.wanted or self.retired)

    # -- what the engine does with the worker ---------------------------------------------

    def start_loads(self, in_use: set[int]) -> list[tuple[int, AdapterInfo]]:
        """(slot, adapter) of each load to start now, oldest wish first: into a free
        slot, else over the least recently planned loaded adapter that no request here
        uses (in_use: lora_ids of this worker's running requests). A wish that finds no slot
        stays wanted until one frees."""
        started = []
        for lora_id, (adapter, evict) in list(self.wanted.items()):
            slot = self._take_slot(in_use if evict else None)
            if slot is None:
                if evict:
                    break  # the oldest wish that may evict waits for a slot first
                del self.wanted[lora_id]  # a prefetch: wanted again when admission needs it
                continue
            del self.wanted[lora_id]
            self._slot_of[lora_id] = slot
            started.append((slot, adapter))
        return started

    def _take_slot(self, in_use: set[int] | None) -> int | None:
        """A free slot, else (in_use given) the least recently planned unused one."""
        if self._free:
            return self._free.pop()
        if in_use is None:
            return None
        for lora_id in self._lru:
            if lora_id not in in_use and lora_id not in self._fresh:
                return self._evict(lora_id)
        return None

    def _evict(self, lora_id: int) -> int:
        slot = self._slot_of.pop(lora_id)
        self._ready.discard(lora_id)
        self._lru.pop(lora_id, None)
        self._fresh.discard(lora_id)
        self.retired.discard(lora_id)
        return slot

    def loaded(self, lora_id: int) -> None:
        """The worker answered the load: requests of it may be planned."""
        if lora_id in self._slot_of:
            self._ready.add(lora_id)
            self._lru[lora_id] = None
            self._fresh.add(lora_id)

    def load_failed(self, lora_id: int) -> None:
        """The worker refused the load: the slot is free again (its requests fail)."""
        slot = self._slot_of.pop(lora_id, None)
        if slot is not None:
            self._free.append(slot)
        self.retired.discard(lora_id)

    def retire(self, lora_id: int) -> None:
        """The registry unloaded it: no new request names it; evict once unused."""
        self.wanted.pop(lora_id, None)
        if lora_id in self._slot_of:
            self.retired.add(lora_id)

    def sweep_retired(self, in_use: set[int]) -> list[int]:
        """Slots of retired adapters that nothing here uses, freed now: the engine
        unloads them on the worker."""
        slots = []
        for lora_id in list(self.retired):
            if lora_id in self._ready and lora_id not in in_use:
                slot = self._evict(lora_id)
                self._free.append(slot)
                slots.append(slot)
        return slots


class StepAdapters:
    """The distinct adapters of the step being planned: at most max_loras, each loaded."""

    __slots__ = ("ids", "residency")

    def __init__(self, residency: AdapterResidency) -> None:
        self.residency = residency
        self.ids: set[int] = set()

    def may_take(self, request: Request) -> bool:
        """Whether the request could join this step (its adapter loaded and in, or room)."""
        adapter = request.adapter
        if adapter is None or adapter.lora_id in self.ids:
            return True
        residency = self.residency
        if not residency.is_ready(adapter.lora_id):
            # Evicted while it waited (only running requests pin a slot): wanted again.
            if not residency.holds(adapter.lora_id):
                residency.want(adapter)
            return False
        return len(self.ids) < residency.max_loras

    def take(self, request: Request) -> bool:
        """may_take, and the request's adapter joins the step when it may."""
        if not self.may_take(request):
            return False
        if request.adapter is not None:
            self.ids.add(request.adapter.lora_id)
        return True

    def slot(self, request: Request) -> int:
        """The request's NewSequence.adapter_slot (0: the base)."""
        adapter = request.adapter
        return 0 if adapter is None else self.residency.slot(adapter.lora_id)
