"""The alternated one-stream comparison's pure parts: a round's rate and the summary."""

from __future__ import annotations

import pytest

from bench.formats.one_stream import Round, summarize, throughput
from bench.harness.metrics import RequestTiming


def test_the_figure_is_the_median_of_the_rounds_ratios_not_the_ratio_of_medians():
    rounds = [Round(200, 400, True), Round(300, 300, False), Round(100, 50, True)]
    summary = summarize(rounds)
    assert summary.median_ratio == pytest.approx(1.0)  # ratios 0.5, 1.0, 2.0
    assert (summary.cbserve_median, summary.llamacpp_median) == (200, 300)
    assert summary.best_ratio == pytest.approx(300 / 400)
    assert summary.rounds == 3


def test_one_slow_round_moves_the_median_ratio_little():
    calm = [Round(250, 370, i % 2 == 0) for i in range(8)]
    summary = summarize([*calm, Round(250, 40, True)])  # llama-server hit a slow second
    assert summary.median_ratio == pytest.approx(250 / 370)


def test_no_round_is_an_error():
    with pytest.raises(ValueError, match="no round"):
        summarize([])


def test_throughput_counts_from_the_send_to_the_last_token():
    timing = RequestTiming(prompt_tokens=32, sent_at=10.0)
    timing.chunks = [(10.1, 1), (10.3, 2), (10.5, 1)]
    timing.finish_reason = "LENGTH"
    assert throughput(timing) == pytest.approx(4 / 0.5)


def test_a_failed_request_fails_the_measurement():
    timing = RequestTiming(prompt_tokens=32, sent_at=0.0, error="UNAVAILABLE: gone")
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        throughput(timing)
