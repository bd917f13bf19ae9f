"""Which worker a request goes to: pure functions over what each engine reports.

A new request goes where the longest prefix of its prompt is cached, then to
the least loaded, then to the one given the fewest so far (equal workers take
turns). A cached prefix counts only on a worker with nobody waiting: a hit
saves a prefill, but queueing behind a backlog costs more, and without this
rule every request sharing a popular prefix (a system prompt) would pile onto
the one worker that cached it while the others idle. A LoRA adapter's request goes
first to a worker that holds its adapter, by the same rule (nobody waiting there):
it is planned there without a load, and the prefix lookup is the adapter's own.

A lost worker's request is resumed over its prompt and output, which no
prefix cache holds whole: it goes to the least loaded worker that fits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from common.errors import ServiceError
from scheduler_svc.core.prefix_hash import adapter_root

if TYPE_CHECKING:
    from scheduler_svc.lora.registry import AdapterInfo


class Candidate(Protocol):
    """What placement reads of a connected worker's engine."""

    @property
    def load(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    num_submitted: int

    def fits(self, num_tokens: int) -> bool: ...

    def cached_prefix_tokens(self, token_ids: Sequence[int], root: int | None = None) -> int: ...

    def holds_adapter(self, lora_id: int) -> bool: ...


C = TypeVar("C", bound=Candidate)


def pick_for_new(
    candidates: Sequence[C],
    prompt_token_ids: Sequence[int],
    num_tokens: int,
    adapter: AdapterInfo | None = None,
) -> C:
    """The worker for a new request that may hold num_tokens of KV (generating with
    `adapter`, None: the base); raises ServiceError (UNAVAILABLE) when no candidate is
    connected or none can hold it."""
    if not candidates:
        raise ServiceError("no worker is connected; try again shortly", grpc.StatusCode.UNAVAILABLE)
    fitting = [candidate for candidate in candidates if candidate.fits(num_tokens)]
    if not fitting:
        raise ServiceError(
            f"no connected worker's KV pool holds {num_tokens} tokens; lower max_tokens",
            grpc.StatusCode.UNAVAILABLE,
        )
    # The base's lookup is called without a root, as readers that know no adapter take it.
    root = () if adapter is None else (adapter_root(adapter),)

    def preference(candidate: C) -> tuple:
        idle = candidate.num_waiting == 0
        holds = adapter is not None and idle and candidate.holds_adapter(adapter.lora_id)
        return (
            holds,
            candidate.cached_prefix_tokens(prompt_token_ids, *root) if idle else 0,
            -candidate.load,
            -candidate.num_submitted,
        )

    return max(fitting, key=preference)


def pick_for_resume(candidates: Sequence[C], num_tokens: int) -> C | None:
    """The worker to resume a moved request on; None while no candidate can hold it."""
    fitting = [candidate for candidate in candidates if candidate.fits(num_tokens)]
    if not fitting:
        return None
    return min(fitting, key=lambda candidate: (candidate.load, candidate.num_submitted))
