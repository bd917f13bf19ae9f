"""What results.py derives from the server's counters: the split of a step."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.harness.results import Column, step_split, summaries
from bench.harness.runner import counter_growth
from common.metrics import parse_samples


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    return parse_samples(generate_latest(registry).decode())


def test_step_split_sums_every_worker_of_a_scrape():
    registry = CollectorRegistry()
    labels = ("model_name", "worker")
    forward = Histogram("cbserve_step_forward_seconds", "f", labels, registry=registry)
    overhead = Histogram("cbserve_step_overhead_seconds", "o", labels, registry=registry)
    before = _scrape(registry)
    for worker, f, o in [("a", 0.09, 0.01), ("a", 0.18, 0.02), ("b", 0.27, 0.03)]:
        forward.labels("m", worker).observe(f)
        overhead.labels("m", worker).observe(o)
    split = step_split(counter_growth(before, _scrape(registry)))
    assert split["steps"] == 3
    assert math.isclose(split["mean_step_ms"], 200.0)
    assert math.isclose(split["step_overhead_pct"], 10.0)


def test_no_steps_no_split():
    # transformers' baseline has no server, so nothing is scraped for it.
    assert step_split({}) == {}
    assert step_split({"cbserve_step_forward_seconds_count": 0.0}) == {}


def test_summaries_carry_the_split_and_the_preemptions():
    counters = {
        "cbserve_num_preemptions_total": 2.0,
        'cbserve_step_forward_seconds_count{worker="a"}': 4.0,
        'cbserve_step_forward_seconds_sum{worker="a"}': 0.3,
        'cbserve_step_overhead_seconds_sum{worker="a"}': 0.1,
    }
    column = Column("cbserve", "cbserve", math.inf, wall_s=1.0, info={"server_counters": counters})
    (summary,) = summaries([column], {}).values()
    assert summary["preemptions"] == 2
    assert (summary["steps"], summary["mean_step_ms"], summary["step_overhead_pct"]) == (
        4,
        100.0,
        25.0,
    )
