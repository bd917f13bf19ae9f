"""Router statistics (worker_svc/router_stats.py): the tokens each expert of each
mixture layer was routed, counted by the model as it routes and read at a scrape."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest

from tests.worker.architectures.test_float_forward import CPU, Paged, prompt
from worker_svc.attention import CpuAttentionBackend
from worker_svc.metrics import WorkerMetrics
from worker_svc.model_loader import load_model
from worker_svc.router_stats import METRIC, expert_layers

pytestmark = pytest.mark.model


def scraped(metrics: WorkerMetrics) -> dict[tuple[str, str], float]:
    """(layer, expert) -> count, parsed from the registry's exposition text."""
    counts = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(f"{METRIC}_total{{"):
            labels = dict(
                part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            key = (labels["layer"].strip('"'), labels["expert"].strip('"'))
            counts[key] = float(line.rsplit(" ", 1)[1])
    return counts


def test_a_scrape_counts_every_token_k_times_per_layer(checkpoints):
    own = load_model(checkpoints["qwen3_moe"], "float32", CPU)
    moe = own.model.spec.moe
    metrics = WorkerMetrics(model_name="moe")
    metrics.watch_experts(own.model)
    assert scraped(metrics) and not any(scraped(metrics).values())
    ids = prompt(21, 24)
    with torch.inference_mode():
        paged = Paged(own, CpuAttentionBackend())
        paged.step(ids[:20], 0)  # grouped by expert
        for i in range(20, 24):  # one row at a time
            paged.step(ids[i : i + 1], i)
    counts = scraped(metrics)
    for layer, _ in expert_layers(own.model):
        per_layer = [counts[(str(layer), str(e))] for e in range(moe.num_experts)]
        assert sum(per_layer) == 24 * moe.experts_per_token
    # The last layer's MLP runs on the sampled rows only (here all of them).
    assert len(counts) == moe.num_experts * len(moe.sparse_layers)


def test_a_dense_model_adds_no_series(checkpoints):
    own = load_model(checkpoints["qwen3"], "float32", CPU)
    metrics = WorkerMetrics(model_name="dense")
    metrics.watch_experts(own.model)
    assert not scraped(metrics)
