"""Helpers for the operations tests: health checks and worker metrics."""

from __future__ import annotations

import re
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

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


def worker_metrics_url(worker: ChildProcess) -> str:
    """The /metrics URL a worker started with --metrics-port 0 printed in its ready line."""
    line = worker.wait_ready()
    host = re.search(r" ready on (\S+):\d+ ", line).group(1)
    port = re.search(r"metrics_port=(\d+)", line).group(1)
    return f"http://{host}:{port}/metrics"


def per_worker(samples: dict[str, float], name: str, worker: str) -> float:
    return samples.get(f'{name}{{worker="{worker}"}}', 0.0)
