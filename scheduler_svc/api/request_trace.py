"""One Generate call's timeline, turned into metrics and one summary log line.

The Generate handler owns a RequestTrace for the life of the call: it stamps
the tokens as they are sent to the client (so TTFT and inter-token latency
are what the client sees, less the network), and at the end records exactly
one outcome: finished (stop, length, or abort when the client went away) or
failed (an error status). The time a request was first scheduled comes from
its engine (WorkerEngine.take_first_scheduled_time), since only the step loop
sees the plan.

The summary line is logged from the handler, whose structlog contextvars carry
the request_id, so it needs no id of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import structlog

from scheduler_svc.core.request import RequestOutput
from scheduler_svc.metrics import SchedulerMetrics

log = structlog.get_logger("scheduler.request")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


class RequestTrace:
    def __init__(
        self, metrics: SchedulerMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.arrival = clock()
        self.worker: str | None = None
        self.submitted: float | None = None
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.output_tokens = 0
        # The workers it left with its KV (a drain), oldest first.
        self.moved_from: list[str] = []
        # (code, message) once the call has failed; the handler aborts with it.
        self.failure: tuple[grpc.StatusCode, str] | None = None

    def placed(self, worker: str, prompt_tokens: int, submitted: float | None = None) -> None:
        """submitted: when it was handed to the pool, if not now (an API process's core
        may schedule it before this line runs)."""
        self.worker = worker
        self.prompt_tokens = prompt_tokens
        self.submitted = self.clock() if submitted is None else submitted

    def token_sent(self, output: RequestOutput) -> None:
        if not output.new_token_ids:
            return
        now = self.clock()
        if self.first_token is None:
            self.first_token = now
            self.metrics.time_to_first_token.observe(now - self.arrival)
        else:
            self.metrics.inter_token_latency.observe(now - self.last_token)
        self.last_token = now
        self.output_tokens = output.completion_tokens
        self.cached_prompt_tokens = output.cached_prompt_tokens

    @property
    def queue_time(self) -> float | None:
        if self.submitted is None or self.first_scheduled is None:
            return None
        return self.first_scheduled - self.submitted

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def _summary(self) -> dict:
        moves = {"kv_moved_from": self.moved_from} if self.moved_from else {}
        return {
            **moves,
            "worker": self.worker,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "output_tokens": self.output_tokens,
            "queue_time_s": _rounded(self.queue_time),
            "ttft_s": _rounded(self.ttft),
            "total_time_s": _rounded(self.clock() - self.arrival),
        }

    def finished(self, reason: str) -> None:
        """The request ended with a finish reason: stop, length, or abort (client gone)."""
        metrics = self.metrics
        metrics.count_finished(reason)
        if reason != "abort":
            metrics.e2e_request_latency.observe(self.clock() - self.arrival)
            metrics.request_prompt_tokens.observe(self.prompt_tokens)
            metrics.request_generation_tokens.observe(self.output_tokens)
        if self.queue_time is not None:
            metrics.request_queue_time.observe(self.queue_time)
        log.info("request finished", finish_reason=reason, **self._summary())

    def failed(self, code: grpc.StatusCode, message: str) -> None:
        self.failure = (code, message)
        self.metrics.count_failed(code.name)
        if self.queue_time is not None:
            self.metrics.request_queue_time.observe(self.queue_time)
        log.info("request failed", code=code.name, error=message, **self._summary())
