"""Prometheus metrics in the text exposition format, without a client library.

Three kinds, as Prometheus defines them: counters (only grow), gauges, and
histograms (cumulative buckets, _sum and _count). A metric either holds its
own values (inc / set / observe, per label set) or reads them at scrape time
from a callback, which is how values the scheduler already keeps (queue
lengths, block counts, counters that outlive a worker reconnect) are exported
without being copied on every step.

Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Sequence

Labels = tuple[tuple[str, str], ...]
Samples = Iterable[tuple[dict[str, str], float]]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# Seconds, from a fast step to a long request.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
)  # fmt: skip
# Tokens per request.
TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


class Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        self.name = name
        self.help_text = help_text
        self.labelnames = tuple(labelnames)
        # A metric without labels shows 0 from the start, as Prometheus' own clients
        # do: a scrape before the first event still finds the series.
        self._values: dict[Labels, float] = {} if self.labelnames else {(): 0.0}
        self._callback: Callable[[], Samples] | None = None

    def _key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple((name, str(labels[name])) for name in self.labelnames)

    def remove(self, **labels: str) -> None:
        """Drops one label set's series (a worker that left), so label values do not pile up."""
        self._values.pop(self._key(labels), None)

    def set_callback(self, callback: Callable[[], Samples]) -> None:
        """Reads the metric's samples from callback() at every scrape."""
        self._callback = callback

    def samples(self) -> list[tuple[str, Labels, float]]:
        if self._callback is not None:
            return [(self.name, self._key(labels), value) for labels, value in self._callback()]
        return [(self.name, labels, value) for labels, value in sorted(self._values.items())]

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} {self.kind}"]
        for name, labels, value in self.samples():
            lines.append(f"{name}{_format_labels(labels)} {_format_value(value)}")
        return "\n".join(lines)


class Counter(Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease (inc by {amount})")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(Metric):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = value


class Histogram(Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        buckets: Sequence[float] = LATENCY_BUCKETS,
        labelnames: Sequence[str] = (),
    ) -> None:
        super().__init__(name, help_text, labelnames)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be increasing and distinct, got {buckets}")
        self.buckets = tuple(float(bound) for bound in buckets)
        # Per label set: counts per bucket (not yet cumulative), then sum.
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = {}
        if not self.labelnames:
            self._counts[()] = [0] * (len(self.buckets) + 1)
            self._sums[()] = 0.0

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[key] = self._sums.get(key, 0.0) + value

    def remove(self, **labels: str) -> None:
        key = self._key(labels)
        self._counts.pop(key, None)
        self._sums.pop(key, None)

    def samples(self) -> list[tuple[str, Labels, float]]:
        out = []
        for key in sorted(self._counts):
            cumulative = 0
            for bound, count in zip((*self.buckets, math.inf), self._counts[key], strict=True):
                cumulative += count
                bucket_labels = (*key, ("le", _format_value(bound)))
                out.append((f"{self.name}_bucket", bucket_labels, cumulative))
            out.append((f"{self.name}_sum", key, self._sums[key]))
            out.append((f"{self.name}_count", key, cumulative))
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}

    def register(self, metric: Metric) -> Metric:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help_text, labelnames))

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help_text, labelnames))

    def histogram(
        self,
        name: str,
        help_text: str,
        buckets: Sequence[float] = LATENCY_BUCKETS,
        labelnames: Sequence[str] = (),
    ) -> Histogram:
        return self.register(Histogram(name, help_text, buckets, labelnames))

    def render(self) -> str:
        return "\n".join(metric.render() for metric in self._metrics.values()) + "\n"


def parse_samples(text: str) -> dict[str, float]:
    """Sample name (with labels, as written) -> value; for tests and the benchmark."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
