"""What travels between engines when a worker is lost: requests and their streams.

A lost worker's unfinished requests (Migrant) keep their output processor and
their client's queue, so the Generate handler reading that queue never sees
the move. The pool implements Migrations: where they go next.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.errors import ServiceError
from scheduler_svc.api.validation import ValidatedRequest
from scheduler_svc.core.request import Request, RequestOutput
from scheduler_svc.output.output_processor import RequestOutputProcessor

if TYPE_CHECKING:
    from scheduler_svc.workers.engine import WorkerEngine

# What a Generate handler reads from its queue: outputs, or the error that ended it.
StreamItem = RequestOutput | ServiceError


@dataclass
class Migrant:
    """An unfinished request off a lost worker, on its way to another one."""

    request: Request
    processor: RequestOutputProcessor
    # The client's queue: its Generate handler keeps reading it wherever the request runs.
    queue: asyncio.Queue[StreamItem]
    first_scheduled: float | None
    # When its worker was lost (time.monotonic()).
    lost_at: float


def new_request(validated: ValidatedRequest, deadline: float | None) -> Request:
    """The scheduler's Request for a validated API request, arriving now."""
    return Request(
        request_id=validated.request_id,
        prompt_token_ids=list(validated.prompt_token_ids),
        sampling=validated.sampling,
        arrival_time=time.monotonic(),
        priority=validated.priority,
        deadline=deadline,
    )


class Migrations(Protocol):
    """What an engine asks of its pool about requests that moved (the pool implements it)."""

    def requests_lost(self, engine: WorkerEngine, migrants: list[Migrant]) -> None: ...

    def abort_moved(self, request_id: str) -> None: ...

    def take_moved_first_scheduled_time(self, request_id: str) -> float | None: ...
