"""The checks that admit a request into the scheduler, with the status a client gets
when one fails. One copy, used by both places that admit: GenerationService (one
process, or each API process for what it sees alone) and the core's EdgeHub (the limits
that only the core sees whole once API processes share it: streams across processes,
the queue, ids in flight).

Each check raises ServiceError with a message that says what to do; none changes state.
"""

from __future__ import annotations

from collections.abc import Container

import grpc

from common.errors import ServiceError


def require_a_worker(connected: bool, accepts_without_worker: bool) -> None:
    """UNAVAILABLE when no worker is connected and the pool would not hold the request
    until one comes (no worker has ever connected: nothing says one will)."""
    if not connected and not accepts_without_worker:
        raise ServiceError("no worker is connected; try again shortly", grpc.StatusCode.UNAVAILABLE)


def require_stream_room(open_streams: int, max_streams: int) -> None:
    """RESOURCE_EXHAUSTED at the --max-concurrent-streams limit."""
    if open_streams >= max_streams:
        raise ServiceError(
            f"{open_streams} Generate streams are open (the limit, "
            "--max-concurrent-streams); retry later with backoff",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )


def require_unique_id(request_id: str, in_flight: Container[str]) -> None:
    """ALREADY_EXISTS for an id that names a request still running: aborts and outputs
    are routed by it."""
    if request_id in in_flight:
        raise ServiceError(
            f"request_id {request_id!r} is already in flight; use a unique id",
            grpc.StatusCode.ALREADY_EXISTS,
        )


def require_queue_room(waiting: int, max_waiting: int) -> None:
    """RESOURCE_EXHAUSTED at the --max-waiting-requests limit."""
    if waiting >= max_waiting:
        raise ServiceError(
            f"{waiting} requests are already queued (the limit, "
            "--max-waiting-requests); retry later with backoff",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        )
