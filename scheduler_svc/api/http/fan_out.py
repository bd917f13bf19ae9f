"""The choices of one HTTP call, run side by side through the one request path.

Each choice is one GenerateRequest iterated by GenerationService.generate in a task
of its own: its own structlog context (its request_id in its log lines) and its own
cancellation. Their responses meet in one queue, in the order they are produced,
so a stream interleaves the choices as their tokens come. Cancelling the fan-out
(the client went away, or one choice failed) cancels every task, and the shared
path's cleanup aborts each request: its blocks are freed at the next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog

from cbserve.v1 import generation_pb2 as pb
from common.errors import ServiceError
from scheduler_svc.api.http.translate import Choice

log = structlog.get_logger("scheduler.http")

_DONE = object()


class FanOut:
    def __init__(self, service, choices: list[Choice]) -> None:
        self._service = service
        self.choices = choices
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._run(choice)) for choice in choices]
        self._running = len(choices)
        # What first() read ahead, given again by events().
        self._buffer: list[tuple[int, pb.GenerateResponse]] = []

    async def _run(self, choice: Choice) -> None:
        try:
            async for response in self._service.generate(choice.request):
                self._queue.put_nowait((choice.index, response))
        except ServiceError as error:
            self._queue.put_nowait((choice.index, error))
        except Exception as error:  # a bug here: the call fails as INTERNAL, not hangs
            log.exception("choice failed", request_id=choice.request.request_id)
            self._queue.put_nowait((choice.index, ServiceError(f"internal error: {error!r}")))
        finally:
            self._queue.put_nowait((choice.index, _DONE))

    async def _next(self) -> tuple[int, pb.GenerateResponse] | None:
        """The next response of any choice; None once all are done; raises ServiceError."""
        while self._running:
            index, item = await self._queue.get()
            if item is _DONE:
                self._running -= 1
            elif isinstance(item, ServiceError):
                self.cancel()
                raise item
            else:
                return index, item
        return None

    async def first(self) -> None:
        """Waits until every choice has answered once (placed and producing), so that
        a refusal is answered with its HTTP status before a stream starts; raises
        ServiceError."""
        waiting = {choice.index for choice in self.choices}
        while waiting:
            event = await self._next()
            if event is None:
                return
            waiting.discard(event[0])
            self._buffer.append(event)

    async def events(self) -> AsyncIterator[tuple[int, pb.GenerateResponse]]:
        """Every response, tagged with its choice's index; raises ServiceError."""
        while self._buffer:
            yield self._buffer.pop(0)
        while (event := await self._next()) is not None:
            yield event

    async def collect(self) -> dict[int, list[pb.GenerateResponse]]:
        """All responses of each choice, for a response that is not streamed."""
        collected: dict[int, list[pb.GenerateResponse]] = {c.index: [] for c in self.choices}
        async for index, response in self.events():
            collected[index].append(response)
        return collected

    def cancel(self) -> None:
        """Ends every choice still running; each request is aborted by its own cleanup."""
        for task in self._tasks:
            task.cancel()
