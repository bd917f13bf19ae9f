"""Arrival times: gamma gaps of mean 1/rate, shape = burstiness, scaled to N/rate."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time

import pytest

from bench.harness.arrivals import describe_rate, gamma_gaps, paced, send_offsets


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_the_gamma_variance(burstiness):
    rate = 8.0
    gaps = gamma_gaps(40_000, rate, burstiness, random.Random(3))
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # Gamma(shape k, scale 1/(R k)): variance k * scale^2 = 1 / (R^2 k).
    assert statistics.pvariance(gaps) == pytest.approx(1 / (rate**2 * burstiness), rel=0.08)


def test_infinite_rate_sends_everything_at_once():
    assert send_offsets(5, math.inf) == [0.0] * 5


def test_infinite_burstiness_sends_evenly():
    assert send_offsets(4, 2.0, math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_offsets_end_at_n_over_rate_and_repeat_with_the_seed():
    offsets = send_offsets(50, 5.0, 1.0, seed=11)
    assert offsets[-1] == pytest.approx(50 / 5.0)
    assert offsets == sorted(offsets)
    assert offsets == send_offsets(50, 5.0, 1.0, seed=11)
    assert offsets != send_offsets(50, 5.0, 1.0, seed=12)


def test_bad_rates_are_refused():
    with pytest.raises(ValueError):
        gamma_gaps(3, 0.0, 1.0, random.Random(0))
    with pytest.raises(ValueError):
        gamma_gaps(3, 1.0, -1.0, random.Random(0))


def test_paced_never_sends_early():
    offsets = [0.0, 0.05, 0.1]

    async def collect():
        start = time.perf_counter()
        return [(item, time.perf_counter() - start) async for item in paced("abc", offsets)]

    sent = asyncio.run(collect())
    assert [item for item, _ in sent] == ["a", "b", "c"]
    for (_, at), offset in zip(sent, offsets, strict=True):
        assert at >= offset - 0.002


def test_describe_rate():
    assert describe_rate(math.inf, 1.0) == "all at once"
    assert describe_rate(2.0, 1.0) == "2 req/s (Poisson)"
    assert describe_rate(2.0, 0.5) == "2 req/s (gamma, burstiness 0.5)"
