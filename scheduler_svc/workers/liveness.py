"""Why a worker counts as lost, and when it may come back.

A worker is alive only while it answers. Three means find one that does not,
whatever it is doing (see worker_client): HTTP/2 keepalive pings on its
channel (a dead process, a stopped one, a dropped network), a deadline on
every step scaled to the tokens it computes (a stuck forward pass whose
process still answers pings), and a reader that watches the Step stream all
the time, not only after a write (a worker that dies while idle, or before
its first request). LossCause names which one fired; it is the `cause`
label of cbserve_worker_lost_total and a field of the `worker lost` log line.

Coming back: a lost worker is reconnected after a short pause, retrying with
a growing delay while it does not answer. A worker that is lost again soon
after it came back (flapping: an OOM loop, a failing node) is held out for a
hold-out that doubles with every such loss, so that requests are not placed
on it only to be recomputed again; one that stays up for STABLE_AFTER_S is
forgiven.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from enum import StrEnum

import grpc
import structlog

from common.grpc_status import connection_broke

log = structlog.get_logger("scheduler.liveness")


class LossCause(StrEnum):
    # The stream or its connection ended: the process is gone (FIN or RST), it
    # restarted, or it closed the stream.
    DISCONNECTED = "disconnected"
    # A keepalive ping went unanswered: the process is stopped or unreachable.
    KEEPALIVE = "keepalive"
    # No step result within the step's deadline: a stuck forward pass.
    STEP_TIMEOUT = "step_timeout"
    # The worker answered out of protocol or ended the stream with an error.
    PROTOCOL = "protocol"


class WorkerLost(Exception):
    """The worker's stream broke, it stopped answering, or it answered out of protocol."""

    def __init__(self, message: str, cause: LossCause = LossCause.DISCONNECTED) -> None:
        super().__init__(message)
        self.cause = cause


def cause_of(error: grpc.aio.AioRpcError) -> LossCause:
    """The cause of a broken Step stream, from the status grpc ended it with."""
    code = error.code()
    details = (error.details() or "").lower()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and (
        "ping" in details or "keepalive" in details
    ):
        # grpc's own words for a keepalive ping past its timeout: "ping timeout".
        return LossCause.KEEPALIVE
    if connection_broke(code, error.details()):
        return LossCause.DISCONNECTED
    # INTERNAL from the worker (a failed step), INVALID_ARGUMENT (a refused plan),
    # ABORTED (another scheduler took the worker): its state is not ours any more.
    return LossCause.PROTOCOL


# Pause before the first reconnect attempt, then between attempts that failed:
# the one backoff policy of every (re)connect to a worker (keep_trying; the
# channel's own reconnect backoff is bounded by the same figures, see
# reconnect_channel_options).
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
# A worker lost less than this long after it (re)connected is flapping.
STABLE_AFTER_S = 60.0
# The hold-out of a flapping worker: doubles with every quick loss, up to the cap.
FIRST_HOLD_OUT_S = 2.0
MAX_HOLD_OUT_S = 120.0


class Comeback:
    """One worker's reconnect schedule; the engine tells it of each connect and loss."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # When it came back after its last loss (None before any loss: a worker
        # lost once, soon after the scheduler started, is not flapping).
        self._reconnected_at: float | None = None
        self._ever_lost = False
        # Losses in a row, each within STABLE_AFTER_S of the connect before it.
        self.quick_losses = 0

    def connected(self) -> None:
        if self._ever_lost:
            self._reconnected_at = self._clock()

    def lost(self) -> float:
        """Records a loss; returns how long the worker is held out before the first
        reconnect attempt (RETRY_DELAYS_S[0] unless it is flapping)."""
        now = self._clock()
        back = self._reconnected_at
        quick = back is not None and now - back < STABLE_AFTER_S
        self.quick_losses = self.quick_losses + 1 if quick else 0
        self._reconnected_at = None
        self._ever_lost = True
        return max(RETRY_DELAYS_S[0], self.hold_out_s)

    @property
    def hold_out_s(self) -> float:
        if self.quick_losses == 0:
            return 0.0
        return min(MAX_HOLD_OUT_S, FIRST_HOLD_OUT_S * 2 ** (self.quick_losses - 1))

    @staticmethod
    def retry_delays() -> Iterator[float]:
        """Delays between failed reconnect attempts: growing, then the last one forever."""
        yield from RETRY_DELAYS_S[1:]
        while True:
            yield RETRY_DELAYS_S[-1]


def reconnect_channel_options() -> list[tuple[str, int]]:
    """gRPC's channel reconnect backoff, within one connect attempt, on the same
    figures as keep_trying: from the first delay up to the last."""
    return [
        ("grpc.initial_reconnect_backoff_ms", int(RETRY_DELAYS_S[0] * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(RETRY_DELAYS_S[0] * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(RETRY_DELAYS_S[-1] * 1000)),
        # A worker's name that does not resolve yet (its container or pod is
        # starting) is looked up again as often, not every 30 s (grpc's default).
        ("grpc.dns_min_time_between_resolutions_ms", int(RETRY_DELAYS_S[0] * 1000)),
    ]


async def keep_trying(
    connect: Callable[[], Awaitable[object]],
    on_failure: Callable[[WorkerLost], None] | None = None,
) -> int:
    """Awaits connect() until it stops raising WorkerLost, pausing RETRY_DELAYS_S
    between failed attempts; returns how many attempts it took."""
    delays = Comeback.retry_delays()
    attempts = 1
    while True:
        try:
            await connect()
            return attempts
        except WorkerLost as error:
            if on_failure is not None:
                on_failure(error)
            await asyncio.sleep(next(delays))
            attempts += 1
