"""Helpers for the operations tests: health checks and worker metrics.

Metrics are read with prometheus-client's parser (common.metrics.parse_samples,
exposed_types)."""

from __future__ import annotations

import re
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from cbserve.local_stack import ChildProcess
from common.metrics import parse_samples

GENERATION = "cbserve.v1.Generation"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_samples(response.read().decode())


def exposed_types(text: str) -> dict[str, str]:
    """Metric name, as exposed, -> its type ("counter", "gauge", "histogram")."""
    # The parser names a counter family without its `_total`, as OpenMetrics does.
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in text_string_to_metric_families(text)
    }


def worker_metrics_url(worker: ChildProcess) -> str:
    """The /metrics URL a worker started with --metrics-port printed in its ready line."""
    line = worker.wait_ready()
    host = re.search(r" ready on (\S+):\d+ ", line).group(1)
    port = re.search(r"metrics_port=(\d+)", line).group(1)
    return f"http://{host}:{port}/metrics"


def per_worker(samples: dict[str, float], name: str, worker: str) -> float:
    return samples.get(f'{name}{{worker="{worker}"}}', 0.0)
