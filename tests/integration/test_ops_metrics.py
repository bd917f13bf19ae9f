"""Every metric the issue names, on a real stack, with the values a few requests leave.

The scheduler serves its metrics at --metrics-port; the worker, started with
a --metrics-port, serves its own forward-time histogram and prints the port in
its ready line. Both label every cbserve_* series with `model_name` and serve
their process metrics beside them. Read with prometheus-client's parser.
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cbserve.client import Client
from tests.integration.conftest import POOL_STACK_BLOCKS as BLOCKS
from tests.integration.ops import exposed_types, per_worker, scrape, worker_metrics_url
from tests.waiting import wait_until

HISTOGRAMS = [
    "cbserve_time_to_first_token_seconds",
    "cbserve_inter_token_latency_seconds",
    "cbserve_e2e_request_latency_seconds",
    "cbserve_request_queue_time_seconds",
    "cbserve_request_prompt_tokens",
    "cbserve_request_generation_tokens",
    "cbserve_step_duration_seconds",
    "cbserve_step_forward_seconds",
    "cbserve_step_overhead_seconds",
]
COUNTERS = [
    "cbserve_requests_finished_total",
    "cbserve_requests_failed_total",
    "cbserve_num_preemptions_total",
    "cbserve_prefix_cache_queries_total",
    "cbserve_prefix_cache_hits_total",
    "cbserve_worker_requests_total",
]
GAUGES = [
    "cbserve_num_requests_running",
    "cbserve_num_requests_waiting",
    "cbserve_kv_blocks_total",
    "cbserve_kv_blocks_used",
    "cbserve_kv_blocks_cached",
    "cbserve_kv_cache_usage_ratio",
    "cbserve_workers_connected",
    "cbserve_worker_connected",
    "cbserve_worker_num_requests_running",
    "cbserve_worker_num_requests_waiting",
    "cbserve_worker_kv_blocks_used",
    "cbserve_worker_kv_blocks_total",
    "cbserve_worker_kv_cache_usage_ratio",
]
WORKER_HISTOGRAMS = ["cbserve_worker_forward_seconds", "cbserve_worker_batch_tokens"]
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def metrics_stack(pool_stack):
    return pool_stack  # the session's: 128 blocks, the worker's metrics on a free port


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def test_finished_failed_and_cancelled_requests_are_counted(metrics_stack):
    before = metrics_stack.metrics()
    with Client(metrics_stack.address) as client:
        done = client.complete("Count to ten.", max_tokens=MAX_TOKENS, ignore_eos=True)
        assert done.finish_reason == "LENGTH"
        with pytest.raises(grpc.RpcError) as raised:
            client.complete("Hi", top_p=2.0)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stream = client.generate("Tell me a long story.", max_tokens=200, ignore_eos=True)
        next(stream)
        stream.close()  # cancels the call

    def delta(name: str) -> float:
        return metrics_stack.metrics().get(name, 0.0) - before.get(name, 0.0)

    wait_until(
        "the cancelled request is counted",
        lambda: delta('cbserve_requests_finished_total{reason="abort"}') == 1,
        timeout_s=30,
    )
    assert delta('cbserve_requests_finished_total{reason="length"}') == 1
    assert delta('cbserve_requests_failed_total{code="INVALID_ARGUMENT"}') == 1
    # Only the request that ran to its end is in the per-request histograms...
    assert delta("cbserve_e2e_request_latency_seconds_count") == 1
    assert delta("cbserve_request_generation_tokens_sum") == MAX_TOKENS
    # ...but both that reached a worker were queued and sent a first token.
    assert delta("cbserve_request_queue_time_seconds_count") == 2
    assert delta("cbserve_time_to_first_token_seconds_count") == 2
    assert delta("cbserve_inter_token_latency_seconds_count") >= MAX_TOKENS - 1
    worker = f"{metrics_stack.host}:{metrics_stack.worker_ports[0]}"
    assert delta(f'cbserve_worker_requests_total{{worker="{worker}"}}') == 2


def test_every_scheduler_metric_is_exposed_with_its_type(metrics_stack):
    # After the test above, or alone: one request leaves a sample in every histogram.
    with Client(metrics_stack.address) as client:
        client.complete("Hello", max_tokens=3, ignore_eos=True)
    text = _text(metrics_stack.metrics_url)
    types = exposed_types(text)
    expected = {
        **dict.fromkeys(HISTOGRAMS, "histogram"),
        **dict.fromkeys(COUNTERS, "counter"),
        **dict.fromkeys(GAUGES, "gauge"),
    }
    assert {name: types.get(name) for name in expected} == expected
    samples = metrics_stack.metrics()
    for name in HISTOGRAMS:
        assert any(key.startswith(f"{name}_count") and value > 0 for key, value in samples.items())
        assert any(key.startswith(f"{name}_bucket") and 'le="+Inf"' in key for key in samples)
    worker = f"{metrics_stack.host}:{metrics_stack.worker_ports[0]}"
    # Every iteration is split once: forward and overhead count the same steps.
    steps = samples[f'cbserve_step_duration_seconds_count{{worker="{worker}"}}']
    assert samples[f'cbserve_step_forward_seconds_count{{worker="{worker}"}}'] == steps
    assert samples[f'cbserve_step_overhead_seconds_count{{worker="{worker}"}}'] == steps
    assert per_worker(samples, "cbserve_worker_connected", worker) == 1
    assert per_worker(samples, "cbserve_worker_kv_blocks_total", worker) == BLOCKS
    assert samples["cbserve_workers_connected"] == 1


def test_the_worker_exposes_its_forward_time(metrics_stack):
    url = worker_metrics_url(metrics_stack.workers[0])
    with Client(metrics_stack.address) as client:
        before = scrape(url)
        client.complete("Hello", max_tokens=3, ignore_eos=True)
    after = scrape(url)
    types = exposed_types(_text(url))
    for name in WORKER_HISTOGRAMS:
        assert types[name] == "histogram"
    # One prefill step and two decodes at least (the plan that drops the finished
    # sequence may come after the reply).
    steps = (
        after["cbserve_worker_forward_seconds_count"]
        - before["cbserve_worker_forward_seconds_count"]
    )
    assert steps >= 3
    assert (
        after["cbserve_worker_forward_seconds_sum"] > before["cbserve_worker_forward_seconds_sum"]
    )


def _model_names(text: str) -> set[str | None]:
    """The model_name label of every cbserve_* sample."""
    return {
        sample.labels.get("model_name")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("cbserve_")
    }


def test_both_processes_label_the_model_and_expose_process_metrics(metrics_stack):
    with Client(metrics_stack.address) as client:
        model = client.model_info().model_name
    worker_url = worker_metrics_url(metrics_stack.workers[0])
    # The scheduler names the model directory of its tokenizer, the worker the
    # one it loaded: the same directory here, and the name GetModelInfo reports.
    assert _model_names(_text(metrics_stack.metrics_url)) == {model}
    assert _model_names(_text(worker_url)) == {model}
    for url in (metrics_stack.metrics_url, worker_url):
        samples = scrape(url)
        assert samples["process_resident_memory_bytes"] > 0
        assert samples["process_cpu_seconds_total"] > 0


def test_the_kv_cache_usage_ratio_is_used_over_total_blocks(metrics_stack):
    worker = f"{metrics_stack.host}:{metrics_stack.worker_ports[0]}"
    with Client(metrics_stack.address) as client:
        # Far more tokens than the scrape below takes on any machine: still running then.
        stream = client.generate("Tell me a long story.", max_tokens=1000, ignore_eos=True)
        next(stream)
        # While the request holds blocks: one scrape, so used and ratio agree.
        busy = metrics_stack.metrics()
        stream.close()
    assert busy["cbserve_kv_blocks_total"] == BLOCKS
    assert 0 < busy["cbserve_kv_cache_usage_ratio"] <= 1
    assert busy["cbserve_kv_cache_usage_ratio"] == busy["cbserve_kv_blocks_used"] / BLOCKS
    assert (
        per_worker(busy, "cbserve_worker_kv_cache_usage_ratio", worker)
        == (busy["cbserve_kv_cache_usage_ratio"])
    )
    wait_until(
        "the cancelled request's blocks are freed",
        lambda: metrics_stack.metrics()["cbserve_kv_cache_usage_ratio"] == 0,
        timeout_s=30,
    )
