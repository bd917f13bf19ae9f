"""What a drain and a rebalance read of the worker pool, as a Protocol: they are handed
the pool (pool.py wires both into every engine it makes) without importing it, which
would close an import circle (pool.py imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler_svc.config.core import SchedulerConfig
    from scheduler_svc.metrics import SchedulerMetrics
    from scheduler_svc.workers.engine import WorkerEngine
    from scheduler_svc.workers.kv_moves import KvMoves
    from scheduler_svc.workers.prefill_split import PrefillSplit


class PoolView(Protocol):
    config: SchedulerConfig
    metrics: SchedulerMetrics | None
    split: PrefillSplit
    kv_moves: KvMoves

    def placeable_engines(self) -> list[WorkerEngine]: ...
