"""One engine's side of a move with KV (issue 46): its request detached as the source,
taken in as the destination. The orchestration is kv_moves.py's; the bookkeeping on
the scheduler is core/parking.py's.

Neither side's step loop waits for a move: detach waits (on this side) for the plan in
flight that includes the request to answer, while the loop goes on planning the
others; the transfer runs beside both loops. Each side remembers which Scheduler it
worked on: a worker lost meanwhile gets a fresh one, and what the old one held is gone
(a detached request's blocks with it), so a move across a loss does nothing to the new
one and falls back to recompute.

A parked request is still this engine's: a worker lost while it settles hands it over
with the others (take_migrants unparks it first), and its detach gives up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.cancel_safe import set_within
from scheduler_svc.core import parking
from scheduler_svc.core.request import Request, RequestStatus
from scheduler_svc.workers.handle import Migrant, RequestHandle
from scheduler_svc.workers.shutdown_watch import start_watch

if TYPE_CHECKING:
    from scheduler_svc.core.scheduler import Scheduler

# How long a detach waits for the plans in flight that include its request: a step's
# time, unless the worker hangs (then liveness finds it lost first).
SETTLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Detached:
    """A request out of its source engine, with the client's handle and its KV's blocks."""

    request: Request
    handle: RequestHandle
    block_ids: tuple[int, ...]
    num_tokens: int
    scheduler: Scheduler


@dataclass(frozen=True)
class Reservation:
    """Blocks a destination engine's scheduler set aside for num_tokens of a request's
    KV; writable once the plans sent up to after_step have answered (core/parking.py)."""

    block_ids: tuple[int, ...]
    num_tokens: int
    scheduler: Scheduler
    after_step: int
    # Whether the engine plans one step ahead at most until it is adopted or cancelled.
    holds_lookahead: bool = False


class EngineMoves:
    """Mixed into WorkerEngine (scheduler, _handles, _loop, adapter_loads, connected)."""

    def _init_moves(self) -> None:
        # Requests parked for a move, by id, until detached or given back.
        self._parked: dict[str, Request] = {}
        # Set (and replaced) after every step's result, and when the worker is lost:
        # what a detach waits on.
        self._answered = asyncio.Event()
        # Drained or draining (WorkerPool.drain): nothing new is placed here.
        self.draining = False
        # A graceful shutdown (shutdown_watch.py): the pool drains this worker when it
        # is called; until another instance of the worker connects here.
        self.on_shutting_down: Callable[[], None] | None = None
        self._shutdown_watch: asyncio.Task | None = None
        self._left_instance: str | None = None
        # Reservations here that keep the lookahead at one plan (reserve_kv).
        self._incoming = 0
        # Offered a would-be victim of preemption, to move instead (workers/rebalance.py);
        # put on every scheduler this engine builds. None: preemption only.
        self.victim_mover = None

    def _watch_for_shutdown(self) -> None:
        """On every connect: a restarted worker (another instance) that a shutdown
        drained is placed on again; its health is watched for the next shutdown."""
        instance = self.client.description.instance_id
        if self._left_instance is not None and instance != self._left_instance:
            self._left_instance, self.draining = None, False
        self._stop_shutdown_watch()
        self._shutdown_watch = start_watch(self.client.channel, self.address, self._leaving)

    def _leaving(self) -> None:
        if self.draining or self.on_shutting_down is None:
            return
        self._left_instance = self.client.description.instance_id
        self.on_shutting_down()

    def _stop_shutdown_watch(self) -> None:
        if self._shutdown_watch is not None:
            self._shutdown_watch.cancel()
            self._shutdown_watch = None

    def _step_answered(self) -> None:
        answered, self._answered = self._answered, asyncio.Event()
        answered.set()

    def _unpark_all(self) -> None:
        """The worker is lost: parked requests go back to the queues, to be handed over
        with the others; their detaches give up."""
        if self.scheduler is not None:
            for request in self._parked.values():
                parking.unpark(self.scheduler, request)
        self._parked.clear()
        self._step_answered()

    # -- the source's side ----------------------------------------------------------------

    async def detach(self, request_id: str, timeout_s: float = SETTLE_TIMEOUT_S):
        """Parks the running request, waits until no plan in flight includes it, then
        takes it out with its handle and blocks held (release_hold frees them). None if
        it is not running here, finished meanwhile, has no KV yet, or the worker was lost."""
        scheduler = self.scheduler
        request = scheduler.requests.get(request_id) if scheduler is not None else None
        if request is None or request.status is not RequestStatus.RUNNING:
            # Parked by park_now and finished since (its last token in the plan in flight,
            # or its client gone): nothing to move, and nothing to keep listed.
            self._parked.pop(request_id, None)
            return None
        # Parked already by park_now (its move's caller), or parked here now.
        if self._parked.get(request_id) is not request and not self.park_now(request_id):
            return None
        deadline = time.monotonic() + timeout_s
        while request_id in self._parked and not parking.settled(scheduler, request):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # Not wait_for, which on Python 3.10 and 3.11 can lose a cancel (cancel_safe).
            if not await set_within(self._answered, remaining):
                break
        if self._parked.pop(request_id, None) is None or self.scheduler is not scheduler:
            return None  # the worker was lost: handed over with the others
        handle = self._handles.get(request_id)
        movable = (
            parking.settled(scheduler, request)
            and scheduler.requests.get(request_id) is request
            and request.status is RequestStatus.RUNNING
            and request.num_computed_tokens > 0
            and handle is not None
        )
        if not movable:
            parking.unpark(scheduler, request)
            self._loop.wakeup.set()
            return None
        hold = parking.detach(scheduler, request)
        self._handles.pop(request_id)
        self._loop.wakeup.set()  # the worker is told to drop the sequence
        return Detached(request, handle, hold.block_ids, hold.num_tokens, scheduler)

    def parked_for_move(self, request_id: str) -> Request | None:
        """The running request, parked now if it was not already (its detach follows);
        None if it is not running here."""
        parked = self._parked.get(request_id)
        if parked is not None:
            return parked
        return self._parked[request_id] if self.park_now(request_id) else None

    def park_now(self, request_id: str) -> bool:
        """Parks a running request at once, so that no plan from now on includes it
        (its detach follows); whether it did."""
        scheduler = self.scheduler
        request = scheduler.requests.get(request_id) if scheduler is not None else None
        if request is None or request.status is not RequestStatus.RUNNING:
            return False
        if request_id in self._parked or request not in scheduler.queue.running:
            return False
        parking.park(scheduler, request)
        self._parked[request_id] = request
        return True

    def wake(self) -> None:
        """Wakes an idle step loop: blocks came back here (a move ended)."""
        self._loop.wakeup.set()

    def release_hold(self, detached: Detached) -> None:
        """Frees a detached request's blocks here (its transfer is over)."""
        if self.scheduler is detached.scheduler:
            parking.release_hold(detached.scheduler, detached.request)
            self._loop.wakeup.set()

    def take_waiting_migrants(self) -> list[Migrant]:
        """The waiting requests (no KV yet), out of this engine, for other workers."""
        if self.scheduler is None:
            return []
        now = time.monotonic()
        migrants = []
        for request in parking.take_waiting(self.scheduler):
            handle = self._handles.pop(request.request_id)
            if handle is not None:
                migrants.append(Migrant(request, handle, now))
        return migrants

    # -- the destination's side -----------------------------------------------------------

    def reserve_kv(
        self, request: Request, num_tokens: int, hold_lookahead: bool = False
    ) -> Reservation | None:
        """Blocks here for num_tokens of the request's KV; None where it cannot go. With
        hold_lookahead, this engine plans one step ahead at most until the request is
        adopted or the reservation cancelled (parking.limit_lookahead: its first token
        here comes a step sooner; the other requests here lose the overlap of the
        scheduler's work with the worker's meanwhile, a few milliseconds a step)."""
        scheduler = self.scheduler
        if not self.connected or self.draining or scheduler is None:
            return None
        block_ids = parking.reserve(scheduler, request, num_tokens)
        if block_ids is None:
            return None
        if hold_lookahead:
            self._incoming += 1
            parking.limit_lookahead(scheduler, 1)
        after_step = parking.last_plan_sent(scheduler)
        return Reservation(tuple(block_ids), num_tokens, scheduler, after_step, hold_lookahead)

    def _end_reservation(self, reservation: Reservation) -> None:
        if not reservation.holds_lookahead:
            return
        self._incoming -= 1
        if self._incoming == 0 and self.scheduler is not None:
            parking.limit_lookahead(self.scheduler, self.config.max_steps_in_flight)
            self._loop.wakeup.set()

    async def until_writable(
        self, reservation: Reservation, timeout_s: float = SETTLE_TIMEOUT_S
    ) -> bool:
        """Waits until no plan sent before the reservation may still write its blocks;
        False if this worker was lost meanwhile (or hangs: liveness finds it lost)."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler is reservation.scheduler:
            if parking.answered_through(reservation.scheduler, reservation.after_step):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await set_within(self._answered, remaining):
                return False
        return False

    def cancel_reservation(self, reservation: Reservation, request: Request) -> None:
        self._end_reservation(reservation)
        if self.scheduler is reservation.scheduler:
            parking.release_reservation(reservation.scheduler, request)

    def adopt_with_kv(
        self, request: Request, handle: RequestHandle, reservation: Reservation, num_tokens: int
    ) -> bool:
        """Takes the request in, running over the KV moved into its reservation; False
        (the reservation freed) if this worker was lost since it was made."""
        scheduler = self.scheduler
        if not self.connected or scheduler is not reservation.scheduler:
            return False
        parking.adopt_with_kv(scheduler, request, num_tokens)
        self._end_reservation(reservation)
        handle.holder = self
        self._handles.add(handle)
        self.adapter_loads.kick(scheduler)  # its adapter, if it has one and none is loaded
        self._loop.wakeup.set()
        return True
