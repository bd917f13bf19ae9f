"""Which worker a request goes to: pure functions over what each engine reports.

A new request goes where the longest prefix of its prompt is cached, then to
the least loaded, then to the one given the fewest so far (equal workers take
turns). A cached prefix counts only on a worker with nobody waiting: a hit
saves a prefill, but queueing behind a backlog costs more, and without this
rule every request sharing a popular prefix (a system prompt) would pile onto
the one worker that cached it while the others idle.

A lost worker's request is resumed over its prompt and output, which no
prefix cache holds whole: it goes to the least loaded worker that fits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import grpc

from common.errors import ServiceError


class Candidate(Protocol):
    """What placement reads of a connected worker's engine."""

    @property
    def load(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    num_submitted: int

    def fits(self, num_tokens: int) -> bool: ...

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int: ...


C = TypeVar("C", bound=Candidate)


def pick_for_new(candidates: Sequence[C], prompt_token_ids: Sequence[int], num_tokens: int) -> C:
    """The worker for a new request that may hold num_tokens of KV; raises ServiceError
    (UNAVAILABLE) when no candidate is connected or none can hold it."""
    if not candidates:
        raise ServiceError("no worker is connected; try again shortly", grpc.StatusCode.UNAVAILABLE)
    fitting = [candidate for candidate in candidates if candidate.fits(num_tokens)]
    if not fitting:
        raise ServiceError(
            f"no connected worker's KV pool holds {num_tokens} tokens; lower max_tokens",
            grpc.StatusCode.UNAVAILABLE,
        )
    return max(
        fitting,
        key=lambda candidate: (
            candidate.cached_prefix_tokens(prompt_token_ids) if candidate.num_waiting == 0 else 0,
            -candidate.load,
            -candidate.num_submitted,
        ),
    )


def pick_for_resume(candidates: Sequence[C], num_tokens: int) -> C | None:
    """The worker to resume a moved request on; None while no candidate can hold it."""
    fitting = [candidate for candidate in candidates if candidate.fits(num_tokens)]
    if not fitting:
        return None
    return min(fitting, key=lambda candidate: (candidate.load, candidate.num_submitted))
