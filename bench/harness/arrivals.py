"""When each request is sent: all at once, or gamma-distributed gaps at a mean rate.

`--request-rate R --burstiness B`: the gaps between sends are drawn from a gamma
distribution of shape B and mean 1/R (scale 1/(R*B)). B = 1 is a Poisson process
(exponential gaps); B < 1 sends in bursts, B > 1 more evenly, B = inf exactly every
1/R. As vLLM's serving benchmark does, the drawn send times are then scaled so that
the last one falls at exactly N/R: a seed's sampling noise (1-2% on a few hundred
gaps) would otherwise move the offered load, and with it the throughput, from one
seed to the next.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def gamma_gaps(count: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Raw gaps in seconds, mean 1/rate, before any scaling."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0, got {rate} and {burstiness}")
    if math.isinf(rate):
        return [0.0] * count
    if math.isinf(burstiness):
        return [1.0 / rate] * count
    scale = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, scale) for _ in range(count)]


def send_offsets(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the start of a run at which each of `count` requests is sent."""
    # A stream of its own per seed: the arrival pattern does not depend on how many
    # random numbers the dataset sampling happened to use.
    rng = random.Random(f"arrivals-{seed}")
    offsets = []
    elapsed = 0.0
    for gap in gamma_gaps(count, rate, burstiness, rng):
        elapsed += gap
        offsets.append(elapsed)
    if offsets and offsets[-1] > 0 and not math.isinf(rate):
        factor = (count / rate) / offsets[-1]
        offsets = [offset * factor for offset in offsets]
    return offsets


async def paced(items: Sequence[T], offsets: Sequence[float]) -> AsyncIterator[T]:
    """Yields each item at its offset from the first call (never early, late if the
    event loop is busy: a late send is visible as a lower achieved rate)."""
    start = time.perf_counter()
    for item, offset in zip(items, offsets, strict=True):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield item


def describe_rate(rate: float, burstiness: float) -> str:
    if math.isinf(rate):
        return "all at once"
    kind = "Poisson" if burstiness == 1 else f"gamma, burstiness {burstiness:g}"
    return f"{rate:g} req/s ({kind})"
