"""`cbserve bench` end to end on canned results: columns, ratios, files, a failed baseline.

The stacks and the client are replaced, so this runs in a second; the real stack is
in test_bench_e2e.py.
"""

from __future__ import annotations

import json

import pytest

from bench.harness.metrics import RequestTiming
from bench.harness.runner import RateResult
from bench.serving import serve

pytestmark = [pytest.mark.process, pytest.mark.model]


class FakeStack:
    """Starts like LocalStack, except that a scheduler given --batching fails, as one
    without that flag does."""

    refuse_batching = True
    starts = 0
    stops = 0

    def __init__(self, worker_args, scheduler_args):
        self.scheduler_args = scheduler_args
        self.address = "fake:1"

    def start(self):
        FakeStack.starts += 1
        if self.refuse_batching and "--batching" in self.scheduler_args:
            raise RuntimeError("scheduler exited with code 2 before ready")
        return self

    def stop(self):
        FakeStack.stops += 1


async def fake_run_rates(address, requests, rates, settings, system, scrape=None, api_key=None):
    step = 0.01 if system == "cbserve" else 0.03  # static three times slower
    results = []
    for rate in rates:
        timings = [
            RequestTiming(r.prompt_len, 0.0, [(step * (k + 1), 1) for k in range(r.max_tokens)])
            for r in requests
        ]
        wall = max(t.chunks[-1][0] for t in timings)
        counters = {"cbserve_num_preemptions_total": 2.0} if system == "static" else {}
        results.append(RateResult(rate, timings, wall, {"model": "fake"}, counters))
    return results


@pytest.fixture
def fakes(monkeypatch, model_dir):
    monkeypatch.setattr("cbserve.local_stack.LocalStack", FakeStack)
    monkeypatch.setattr(FakeStack, "starts", 0)
    monkeypatch.setattr(FakeStack, "stops", 0)
    monkeypatch.setattr("bench.harness.runner.run_rates", fake_run_rates)
    return FakeStack


def bench(tmp_path, *flags):
    argv = ["--dataset", "random", "--num-prompts", "4", "--out-dir", str(tmp_path)]
    return serve.main([*argv, "--no-progress", "--no-plots", *flags])


def test_a_baseline_that_cannot_start_is_reported_and_the_rest_is_kept(fakes, tmp_path, capsys):
    assert bench(tmp_path, "--baselines", "static") == 1
    captured = capsys.readouterr()
    assert "static not measured" in captured.err and "--batching static" in captured.err
    assert captured.out.startswith("| metric | cbserve |")
    results = json.loads((tmp_path / "results.json").read_text())
    assert [run["label"] for run in results["runs"]] == ["cbserve"]
    assert results["runs"][0]["summary"]["completed"] == 4
    assert len(results["errors"]) == 1
    assert (FakeStack.starts, FakeStack.stops) == (3, 1)  # static was tried twice


def test_static_beside_cbserve_at_each_rate_with_ratios(fakes, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fakes, "refuse_batching", False)
    assert bench(tmp_path, "--baselines", "static", "--request-rate", "2", "4") == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for column in ("cbserve @ 2 req/s", "static @ 4 req/s", "cbserve vs static @ 4 req/s"):
        assert column in header
    throughput = next(line for line in out.splitlines() if line.startswith("| Output token"))
    assert throughput.endswith("| 3.00x | 3.00x |")
    results = json.loads((tmp_path / "results.json").read_text())
    assert [run["request_rate"] for run in results["runs"]] == [2.0, 4.0, 2.0, 4.0]
    assert FakeStack.starts == FakeStack.stops == 4  # a fresh stack per system and rate
    ratios = results["ratios"]["cbserve vs static @ 2 req/s"]
    assert ratios["Output token throughput (tok/s)"] == 3.0
    preemptions = next(line for line in out.splitlines() if line.startswith("| Preemptions"))
    assert preemptions == "| Preemptions (server) |  |  | 2 | 2 |  |  |"
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.startswith("Command: `cbserve bench --dataset random")
    assert "Machine: " in markdown and "| metric |" in markdown
