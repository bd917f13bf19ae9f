"""common.metrics renders the Prometheus text format; common.metrics_server serves it."""

from __future__ import annotations

import asyncio

import pytest

from common.metrics import Registry, parse_samples
from common.metrics_server import MetricsServer


def test_counters_gauges_and_callbacks_render_with_help_and_type():
    registry = Registry()
    registry.counter("c_total", "A counter.").inc(2)
    registry.gauge("g", "A gauge.", ("worker",)).set(1.5, worker='a"b')
    registry.gauge("cb", "Read at scrape time.").set_callback(lambda: [({}, 7)])
    text = registry.render()
    assert "# HELP c_total A counter.\n# TYPE c_total counter\nc_total 2\n" in text
    assert 'g{worker="a\\"b"} 1.5' in text
    assert parse_samples(text)["cb"] == 7


def test_unlabelled_metrics_show_zero_before_the_first_event():
    registry = Registry()
    registry.counter("c_total", "A counter.")
    registry.histogram("h_seconds", "A histogram.", (0.1, 1.0))
    registry.counter("labelled_total", "Per label.", ("code",))
    samples = parse_samples(registry.render())
    assert samples["c_total"] == 0
    assert samples['h_seconds_bucket{le="+Inf"}'] == 0 and samples["h_seconds_count"] == 0
    assert not any(key.startswith("labelled_total") for key in samples)


def test_histogram_buckets_are_cumulative():
    histogram = Registry().histogram("h", "H.", (0.1, 1.0), ("worker",))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value, worker="a")
    samples = parse_samples(histogram.render())
    assert [samples[f'h_bucket{{worker="a",le="{le}"}}'] for le in ("0.1", "1", "+Inf")] == [
        2,
        3,
        4,
    ]
    assert samples['h_count{worker="a"}'] == 4
    assert samples['h_sum{worker="a"}'] == pytest.approx(3.65)


def test_removed_label_sets_disappear():
    registry = Registry()
    histogram = registry.histogram("h", "H.", (1.0,), ("worker",))
    gauge = registry.gauge("g", "G.", ("worker",))
    for worker in ("a", "b"):
        histogram.observe(0.5, worker=worker)
        gauge.set(1, worker=worker)
    histogram.remove(worker="a")
    gauge.remove(worker="a")
    gauge.remove(worker="never-seen")
    text = registry.render()
    assert 'worker="a"' not in text and 'worker="b"' in text


def test_wrong_labels_are_refused():
    counter = Registry().counter("c_total", "C.", ("code",))
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(reason="x")
    with pytest.raises(ValueError, match="cannot decrease"):
        counter.inc(-1, code="x")


async def _http(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def test_metrics_server_answers_get_and_refuses_the_rest():
    registry = Registry()
    registry.counter("served_total", "C.").inc()

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
                )
            ]
        finally:
            await server.stop()

    get, head, other, post = asyncio.run(scenario())
    assert get.startswith(b"HTTP/1.1 200 OK") and b"served_total 1" in get
    assert b"text/plain; version=0.0.4" in get
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    assert other.startswith(b"HTTP/1.1 404")
    assert post.startswith(b"HTTP/1.1 405")
