"""The scheduler's workers, and which one a new request goes to."""

from __future__ import annotations

import asyncio

import grpc

from common.errors import ServiceError
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.engine import WorkerEngine
from scheduler_svc.tokenizer import Tokenizer


class WorkerPool:
    def __init__(self, addresses: list[str], config: SchedulerConfig, tokenizer: Tokenizer) -> None:
        self.engines = [WorkerEngine(address, config, tokenizer) for address in addresses]

    async def start(self, connect_timeout_s: float) -> None:
        """Connects every worker; raises WorkerLost naming the first that did not answer."""
        await asyncio.gather(*(engine.start(connect_timeout_s) for engine in self.engines))
        models = {engine.client.description.model_name for engine in self.engines}
        if len(models) > 1:
            raise ValueError(f"workers serve different models: {sorted(models)}")

    async def stop(self) -> None:
        await asyncio.gather(*(engine.stop() for engine in self.engines))

    @property
    def num_waiting(self) -> int:
        """Requests queued on every worker, not yet running."""
        return sum(engine.num_waiting for engine in self.engines)

    def connected_engines(self) -> list[WorkerEngine]:
        return [engine for engine in self.engines if engine.connected]

    def pick(self, num_tokens: int) -> WorkerEngine:
        """Of the connected workers whose pool can hold num_tokens, the least loaded."""
        engines = self.connected_engines()
        if not engines:
            raise ServiceError(
                "no worker is connected; try again shortly", grpc.StatusCode.UNAVAILABLE
            )
        fitting = [engine for engine in engines if engine.fits(num_tokens)]
        if not fitting:
            raise ServiceError(
                f"no connected worker's KV pool holds {num_tokens} tokens; lower max_tokens",
                grpc.StatusCode.UNAVAILABLE,
            )
        return min(fitting, key=lambda engine: engine.load)

    def _descriptions(self):
        return [engine.client.description for engine in self.engines if engine.client.description]

    @property
    def max_model_len(self) -> int:
        return min(description.max_model_len for description in self._descriptions())

    @property
    def vocab_size(self) -> int:
        return min(description.vocab_size for description in self._descriptions())

    @property
    def max_worker_capacity_tokens(self) -> int:
        return max(engine.capacity_tokens for engine in self.engines)
