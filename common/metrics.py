"""Prometheus metrics through prometheus-client: a registry per process, its
exposition, and a flat reading of scraped text for tests and the benchmark.

Each process builds its own CollectorRegistry rather than using the library's
global one, so that a test can build several schedulers side by side, each
with its own counters. Every registry also carries the process's resident
memory, CPU seconds and open files (ProcessCollector) and the Python version
(PlatformCollector), the series operators look for first.

Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

# vLLM's name for the label that says which model a series is about.
MODEL_NAME_LABEL = "model_name"

# Seconds, from a fast step to a long request.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
)  # fmt: skip
# Tokens per request.
TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def new_registry() -> CollectorRegistry:
    """A registry of the calling process's own, with its process and platform metrics."""
    # Without this every counter and histogram gains a `_created` gauge beside it:
    # names the metrics never had, which Prometheus' text format does not use.
    # The switch is the library's, for the whole process.
    disable_created_metrics()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry, accept_header: str = "") -> tuple[bytes, str]:
    """The registry's body and Content-Type for a scrape that sent accept_header.

    Negotiated as prometheus-client's own server does: the text format (version
    0.0.4) unless the scraper asks for OpenMetrics or a newer text version.
    """
    encode, content_type = choose_encoder(accept_header)
    return encode(registry), content_type


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def parse_samples(
    text: str, dropped_labels: tuple[str, ...] = (MODEL_NAME_LABEL,)
) -> dict[str, float]:
    """Sample name with its labels (sorted by name, as exposed) -> value.

    Parsed with prometheus-client's parser. The labels in dropped_labels are left
    out of the keys: a process serves one model, so `model_name` is the same on
    every series and keys read `cbserve_kv_blocks_used` rather than spelling the
    model out. Two samples that differ only in a dropped label raise ValueError.
    """
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sorted(
                (name, value) for name, value in sample.labels.items() if name not in dropped_labels
            )
            key = sample.name
            if labels:
                key += "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"
            if key in samples:
                raise ValueError(f"two samples read {key} once {dropped_labels} are left out")
            samples[key] = sample.value
    return samples
