"""TTFT, TPOT, ITL, E2E, throughput and goodput against values computed by hand."""

from __future__ import annotations

import math

import pytest

from bench.harness.metrics import (
    RequestTiming,
    meets_slos,
    parse_goodput,
    per_request,
    percentile,
    stats_ms,
    summarize,
)


def timing(sent, *arrivals, prompt=10, tokens=1):
    return RequestTiming(prompt, sent, [(at, tokens) for at in arrivals], "LENGTH")


def test_one_request_by_hand():
    t = timing(1.0, 1.5, 1.6, 1.8)
    assert t.ttft == pytest.approx(0.5)
    assert t.e2el == pytest.approx(0.8)
    # (E2E - TTFT) / (tokens - 1) = (0.8 - 0.5) / 2
    assert t.tpot == pytest.approx(0.15)
    assert t.itls() == pytest.approx([0.1, 0.2])


def test_a_message_with_several_tokens_counts_them_all():
    t = timing(0.0, 1.0, 2.0, tokens=3)
    assert t.output_tokens == 6
    assert t.tpot == pytest.approx(1.0 / 5)
    assert t.itls() == pytest.approx([1.0])  # ITL is per message, as vLLM counts chunks


def test_one_token_has_no_tpot_and_no_itl():
    t = timing(0.0, 0.25)
    assert t.tpot is None and t.itls() == []


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 99) == pytest.approx(4 + 6 * 0.96)  # numpy: 9.76
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_stats_are_in_milliseconds():
    assert stats_ms([0.1, 0.2, 0.6]) == {"mean": 300.0, "median": 200.0, "p99": 592.0}


def test_summarize_by_hand():
    timings = [
        timing(0.0, 0.5, 0.6, 0.8),  # ttft 0.5, tpot 0.15, e2e 0.8
        timing(0.0, 1.0, 1.5, prompt=20),  # ttft 1.0, tpot 0.5, e2e 1.5
        RequestTiming(30, 0.0, error="UNAVAILABLE: gone"),
    ]
    summary = summarize(timings, wall_s=2.0, slos={"ttft": 600, "tpot": 200})
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_input_tokens"] == 30  # the failed request's prompt is not counted
    assert summary["total_output_tokens"] == 5
    assert summary["request_throughput"] == 1.0
    assert summary["output_throughput"] == 2.5
    assert summary["total_token_throughput"] == 17.5
    assert summary["request_goodput"] == 0.5  # only the first meets both SLOs
    assert summary["ttft_ms"] == {"mean": 750.0, "median": 750.0, "p99": 995.0}
    assert summary["tpot_ms"]["mean"] == 325.0
    assert summary["itl_ms"] == {"mean": pytest.approx(266.67), "median": 200.0, "p99": 494.0}
    assert summary["e2el_ms"]["median"] == 1150.0


def test_goodput_counts_a_one_token_reply_as_tpot_zero():
    assert meets_slos(timing(0.0, 0.1), {"ttft": 100.0, "tpot": 0.0})
    assert not meets_slos(timing(0.0, 0.1), {"ttft": 99.0})
    assert meets_slos(timing(0.0, 0.1, 0.3), {"e2el": 300.0})


def test_summarize_without_slos_has_no_goodput_and_nan_for_empty_stats():
    summary = summarize([timing(0.0, 0.5)], wall_s=1.0)
    assert "request_goodput" not in summary
    assert math.isnan(summary["tpot_ms"]["mean"])


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50.5"]) == {"ttft": 500.0, "tpot": 50.5}
    assert parse_goodput(None) == {}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"], ["ttft:x"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_per_request_records():
    (record,) = per_request([timing(0.0, 0.5, 0.75)])
    assert record == {
        "prompt_tokens": 10,
        "output_tokens": 2,
        "ttft_ms": 500.0,
        "e2el_ms": 750.0,
        "finish_reason": "LENGTH",
        "error": "",
    }
