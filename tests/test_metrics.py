"""common.metrics: a registry per process, prometheus-client's exposition of it and
the flat samples read back with its parser; common.metrics_server serves it."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.metrics import exposition, new_registry, parse_samples
from common.metrics_server import MetricsServer


def _text(registry: CollectorRegistry) -> str:
    return exposition(registry)[0].decode()


class _ReadAtScrape(Collector):
    def collect(self):
        yield GaugeMetricFamily("cb", "Read at scrape time.", value=7)


def test_counters_gauges_and_collectors_render_with_help_and_type():
    registry = CollectorRegistry()
    Counter("c_total", "A counter.", registry=registry).inc(2)
    Gauge("g", "A gauge.", ["worker"], registry=registry).labels(worker='a"b').set(1.5)
    registry.register(_ReadAtScrape())
    text = _text(registry)
    assert "# HELP c_total A counter.\n# TYPE c_total counter\nc_total 2.0\n" in text
    assert 'g{worker="a\\"b"} 1.5' in text
    assert parse_samples(text)["cb"] == 7
    assert parse_samples(text)['g{worker="a\\"b"}'] == 1.5


def test_unlabelled_metrics_show_zero_before_the_first_event():
    registry = new_registry()
    Counter("c_total", "A counter.", registry=registry)
    Histogram("h_seconds", "A histogram.", buckets=(0.1, 1.0), registry=registry)
    Counter("labelled_total", "Per label.", ["code"], registry=registry)
    samples = parse_samples(_text(registry))
    assert samples["c_total"] == 0
    assert samples['h_seconds_bucket{le="+Inf"}'] == 0 and samples["h_seconds_count"] == 0
    assert not any(key.startswith("labelled_total") for key in samples)
    # new_registry turns off the `_created` series: no name the metrics did not have.
    assert not any(key.split("{")[0].endswith("_created") for key in samples)


def test_histogram_buckets_are_cumulative():
    registry = CollectorRegistry()
    histogram = Histogram("h", "H.", ["worker"], buckets=(0.1, 1.0), registry=registry)
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.labels(worker="a").observe(value)
    samples = parse_samples(_text(registry))
    assert [samples[f'h_bucket{{le="{le}",worker="a"}}'] for le in ("0.1", "1.0", "+Inf")] == [
        2,
        3,
        4,
    ]
    assert samples['h_count{worker="a"}'] == 4
    assert samples['h_sum{worker="a"}'] == pytest.approx(3.65)


def test_removed_label_sets_disappear():
    registry = CollectorRegistry()
    histogram = Histogram("h", "H.", ["worker"], buckets=(1.0,), registry=registry)
    gauge = Gauge("g", "G.", ["worker"], registry=registry)
    for worker in ("a", "b"):
        histogram.labels(worker).observe(0.5)
        gauge.labels(worker).set(1)
    histogram.remove("a")
    gauge.remove("a")
    gauge.remove("never-seen")
    text = _text(registry)
    assert 'worker="a"' not in text and 'worker="b"' in text


def test_wrong_labels_are_refused():
    counter = Counter("c_total", "C.", ["code"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="label names"):
        counter.labels(reason="x")
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels(code="x").inc(-1)


def test_a_process_registry_carries_the_process_and_platform_metrics():
    samples = parse_samples(_text(new_registry()))
    assert samples["process_resident_memory_bytes"] > 0
    assert samples["process_cpu_seconds_total"] >= 0
    assert samples["process_open_fds"] > 0
    assert any(key.startswith("python_info{") for key in samples)


def test_parsed_keys_leave_the_model_name_out_but_never_merge_two_series():
    registry = CollectorRegistry()
    gauge = Gauge("g", "G.", ["model_name", "worker"], registry=registry)
    gauge.labels("m", "a").set(3)
    assert parse_samples(_text(registry)) == {'g{worker="a"}': 3}
    assert parse_samples(_text(registry), dropped_labels=()) == {'g{model_name="m",worker="a"}': 3}
    gauge.labels("other", "a").set(4)
    with pytest.raises(ValueError, match="two samples"):
        parse_samples(_text(registry))


async def _http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def test_metrics_server_answers_get_and_refuses_the_rest():
    registry = CollectorRegistry()
    Counter("served_total", "C.", registry=registry).inc()

    async def scenario():
        server = MetricsServer(registry, "127.0.0.1", 0)
        port = await server.start()
        try:
            return [
                await _http(port, request)
                for request in (
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"HEAD /metrics HTTP/1.1\r\n\r\n",
                    b"GET /other HTTP/1.1\r\n\r\n",
                    b"POST /metrics HTTP/1.1\r\n\r\n",
                    b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n",
                )
            ]
        finally:
            await server.stop()

    get, head, other, post, openmetrics = asyncio.run(scenario())
    assert get.startswith(b"HTTP/1.1 200 OK") and b"served_total 1.0" in get
    assert b"text/plain; version=0.0.4" in get
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert other.startswith(b"HTTP/1.1 404")
    assert post.startswith(b"HTTP/1.1 405")
    # A scraper that asks for OpenMetrics gets it, as from prometheus-client's own server.
    assert b"Content-Type: application/openmetrics-text" in openmetrics
    assert openmetrics.endswith(b"# EOF\n")
