"""vLLM's LoRA series, read from the pool at scrape time:

    vllm:lora_requests_info{running_lora_adapters="sql,chat",waiting_lora_adapters="",
                            max_lora="2"} 1.7e9

As vLLM sets it: one sample whose labels carry the adapters of the running and the
waiting requests (comma-separated names) and --max-loras, and whose value is the time
of the reading (seconds since the epoch). Gateways with LoRA affinity (the Gateway API
Inference Extension's endpoint picker) read the labels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAME = "vllm:lora_requests_info"
LABELS = ("running_lora_adapters", "waiting_lora_adapters", "max_lora")


def _names(requests: Iterable) -> str:
    return ",".join(sorted({r.adapter.name for r in requests if r.adapter is not None}))


class LoraCollector(Collector):
    """Over the pool's engines (each with its Scheduler, or None while unconnected)."""

    def __init__(self, pool, max_loras: int, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.max_loras = max_loras
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        schedulers = [e.scheduler for e in self.pool.engines.values() if e.scheduler is not None]
        running = (r for scheduler in schedulers for r in scheduler.running)
        waiting = (r for scheduler in schedulers for r in scheduler.waiting)
        gauge = GaugeMetricFamily(
            NAME,
            "Running and waiting LoRA adapters (names in the labels), and max_lora; "
            "the value is the time of the reading.",
            labels=list(LABELS),
        )
        gauge.add_metric([_names(running), _names(waiting), str(self.max_loras)], self._clock())
        yield gauge
