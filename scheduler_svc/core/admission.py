"""Who runs, who waits, who is preempted: the scheduler's queues and their policy.

Both queues are kept sorted. Running: by (priority, arrival), so the victim of
a preemption is taken from the end: the lowest priority, then the latest
arrival. Waiting: by priority, then preempted requests before fresh ones (a
victim goes back to the front of its priority), then arrival (FCFS).

No head-of-line blocking, and no starvation: when a waiting request does not
fit, the requests behind it are tried. Each time one of them is admitted past
it, its `num_bypassed` grows; once that reaches `max_bypasses`, the queue
stops at it: nothing behind it is admitted until it fits, which happens as
running requests finish (every request has a bounded length). So a request
waits behind at most `max_bypasses` later ones plus what was running.

A request is admitted with blocks for all its current tokens (prompt, plus
output when it resumes after a preemption), minus the prefix-cache hits. Until
it samples a token it needs no new block, and it may not be preempted.

Preemption is by recompute: the victim's blocks are freed (they stay in the
prefix cache, so a prompt that was not evicted in the meantime is found there
again), the worker drops the sequence, and the request goes back to the
waiting queue with its output so far; when readmitted it is prefilled over its
prompt plus that output and continues where it stopped. Its client never sees
a token twice. Where another worker has room, the victim moves there with its KV
instead (core/rebalance.py): nothing is recomputed.

Bounds (checked by the randomized simulation): a request is admitted with
blocks for all its current tokens, so it needs no block until it samples; and
only a request that has sampled since its last admission may be preempted. So
every preemption of a request follows a token generated for it:
num_preemptions <= num_output_tokens, and no two requests can keep evicting
each other without progress.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from scheduler_svc.config.core import SchedulerConfig
from scheduler_svc.core.block_manager import BlockManager
from scheduler_svc.core.prefix_hash import adapter_root, extend_block_hashes
from scheduler_svc.core.prompt_logprobs import wants_prompt_logprobs
from scheduler_svc.core.request import Request, RequestError, RequestStatus
from scheduler_svc.core.stats import SchedulerStats

if TYPE_CHECKING:
    from scheduler_svc.core.victim_mover import VictimMover

# Whether a waiting request may join this step besides its blocks (LoRA adapters).
Gate = Callable[[Request], bool]


@dataclass
class StepState:
    """What one schedule() call did to the queues besides admitting."""

    had_running: bool
    preempted: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)


class AdmissionQueue:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, stats: SchedulerStats
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.stats = stats
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._watermark_blocks = int(config.watermark * block_manager.num_blocks)
        # Asked before a preemption for a block whether the victim may move to another
        # worker with its KV instead (core/rebalance.py); None: always preempt.
        self.mover: VictimMover | None = None

    def add_waiting(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        bisect.insort(self.waiting, request, key=lambda r: r.waiting_order)

    def remove(self, request: Request) -> None:
        """Takes a request out of whichever queue holds it (a no-op if none does)."""
        for queue in (self.waiting, self.running):
            if request in queue:
                queue.remove(request)
                return

    def begin_step(self) -> StepState:
        return StepState(had_running=bool(self.running))

    def running_in_order(self) -> Iterator[Request]:
        """Running requests best first; tolerates removals at or after the current one."""
        index = 0
        while index < len(self.running):
            request = self.running[index]
            yield request
            if index < len(self.running) and self.running[index] is request:
                index += 1

    # -- preemption ----------------------------------------------------------------------

    def make_room(self, request: Request, num_tokens: int, step: StepState) -> bool:
        """Secures blocks for the running request's first num_tokens tokens.

        Preempts the worst preemptible running request until they fit; when that
        is the request itself, it is preempted (False), or failed if it could
        not fit even alone in the pool (False).
        """
        while not self.blocks.can_append_slots(request.seq_id, num_tokens):
            if self.mover is not None and self.mover.moving():
                return False  # a move off this worker gives blocks back soon: wait
            victim = self._victim()
            if victim is None or victim is request:
                # (victim is None cannot happen: a request that needs a block has
                # sampled since admission, so it is preemptible itself.)
                if self.blocks.blocks_needed(num_tokens) > self.blocks.num_blocks:
                    self._fail(request, step, num_tokens)
                elif self.mover is None or not self.mover.offer(request):
                    self._preempt(request, step)
                return False
            if self.mover is not None and self.mover.offer(victim):
                return False  # parked for a move (rebalance.py): its blocks come back
            self._preempt(victim, step)
        return True

    def _victim(self) -> Request | None:
        for request in reversed(self.running):
            if request.sampled_since_admission:
                return request
        return None

    def _preempt(self, request: Request, step: StepState) -> None:
        self.running.remove(request)
        self.blocks.free(request.seq_id)
        # What plans in flight sample for it is dropped (Scheduler.update_from_output
        # tells by num_preemptions); it is recomputed from the tokens it has.
        request.num_computed_tokens = 0
        request.num_pending_samples = 0
        request.num_preemptions += 1
        request.num_bypassed = 0
        self.stats.num_preemptions += 1
        step.preempted.append(request)
        self.add_waiting(request)

    def _fail(self, request: Request, step: StepState, num_tokens: int) -> None:
        self.remove(request)
        if self.blocks.has_blocks(request.seq_id):
            self.blocks.free(request.seq_id)
        capacity = self.blocks.num_blocks * self.blocks.block_size
        request.error = RequestError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the request grew to {num_tokens} tokens but the worker's KV pool holds "
            f"{capacity}; lower max_tokens",
        )
        step.failed.append(request)

    def admit_by_priority(self, step: StepState, gate: Gate | None = None) -> None:
        """Admits waiting requests that outrank running ones, preempting those.

        Only when that makes room: the fewest victims (worst first) after whose
        preemption the candidate fits, or none at all; and only a candidate the
        gate (the step's LoRA adapters) lets in.
        """
        while True:
            candidate = next((r for r in self.waiting if r not in step.preempted), None)
            if candidate is None or not self.running:
                return
            if self.running[-1].priority <= candidate.priority:
                return  # nothing running has a lower priority
            if gate is not None and candidate.adapter is not None and not gate(candidate):
                return  # its adapter is not loaded, or the step has no room for it
            hits = self._cached_prefix(candidate)
            if self._fits(candidate, hits) and len(self.running) < self.config.max_running_seqs:
                return  # admitted the ordinary way, in this step's last pass
            victims = self._victims_making_room(candidate, hits)
            if victims is None:
                return  # preempting everything allowed would still not make room
            for victim in victims:
                self._preempt(victim, step)
            assert self._fits(candidate, hits), "preemption did not make the room it counted on"
            self._admit(candidate, hits)

    def _victims_making_room(self, candidate: Request, hits: list[int]) -> list[Request] | None:
        # Blocks the victims would give back, per block: one is freed once
        # every holder is a victim (blocks shared by two victims count too).
        released: Counter[int] = Counter()
        victims: list[Request] = []
        for request in reversed(self.running):
            if request.priority <= candidate.priority:
                return None
            if not request.sampled_since_admission:
                continue  # protected until it has made progress
            victims.append(request)
            released.update(self.blocks.block_table(request.seq_id))
            if self._fits_after_release(candidate, hits, released, len(victims)):
                return victims
        return None

    def _fits_after_release(
        self, request: Request, hits: list[int], released: Counter[int], num_victims: int
    ) -> bool:
        """What _fits would answer once the victims' blocks are released."""
        num_running = len(self.running) - num_victims
        if num_running >= self.config.max_running_seqs:
            return False
        free = self.blocks.num_free_blocks + sum(
            1 for b, count in released.items() if self.blocks.ref_count(b) == count
        )
        # A hit that nobody holds any more is taken off the free list too
        # (the estimate this replaces forgot that and preempted in vain).
        free -= sum(1 for b in hits if self.blocks.ref_count(b) == released[b])
        fresh = self.blocks.blocks_needed(request.num_tokens) - len(hits)
        watermark = self._watermark_blocks if num_running else 0
        return fresh + watermark <= free

    # -- admission -----------------------------------------------------------------------

    def admit_waiting(self, step: StepState, gate: Gate | None = None) -> Iterator[Request]:
        """Admits waiting requests best first, yielding each; stop iterating to stop.
        One the gate refuses (its LoRA adapter is loading, or the step has its
        max_loras already) waits as one that does not fit: bypassed, so not starved."""
        if self.config.batching == "static" and step.had_running:
            return
        bypassed: list[Request] = []
        for request in list(self.waiting):
            if len(self.running) >= self.config.max_running_seqs:
                return
            if not self._any_may_fit():
                return  # a full pool: skip looking up every waiting request each step
            if request in step.preempted:
                continue  # not back in the same step it was preempted in
            if self.blocks.blocks_needed(request.num_tokens) > self.blocks.num_blocks:
                self._fail(request, step, request.num_tokens)
                continue
            fits = gate is None or request.adapter is None or gate(request)
            hits = self._cached_prefix(request) if fits else []
            if not fits or not self._fits(request, hits):
                if request.num_bypassed >= self.config.max_bypasses:
                    return  # its turn: nothing behind it may pass any more
                bypassed.append(request)
                continue
            self._admit(request, hits)
            for waiting in bypassed:
                waiting.num_bypassed += 1
            yield request
            # Checked after every admission, not only when the pass reaches a
            # bypassed request: else one pass could admit any number past it.
            if any(w.num_bypassed >= self.config.max_bypasses for w in bypassed):
                return

    def _cached_prefix(self, request: Request) -> list[int]:
        # A cached block has no logits: a prompt still to be scored is computed whole.
        if not self.blocks.enable_prefix_caching or wants_prompt_logprobs(request):
            return []
        token_ids = request.all_token_ids
        root = adapter_root(request.adapter)
        extend_block_hashes(request.block_hashes, token_ids, self.blocks.block_size, root)
        # Never the last token: its logits are what the prefill is for.
        return self.blocks.find_cached_prefix(
            token_ids, request.block_hashes, len(token_ids) - 1, root
        )

    def _any_may_fit(self) -> bool:
        # Every admission needs a fresh block beyond the watermark, since a
        # prefix-cache hit never covers the last token.
        return self.blocks.num_free_blocks > (self._watermark_blocks if self.running else 0)

    def _fits(self, request: Request, hits: list[int]) -> bool:
        if not self.blocks.can_allocate(request.num_tokens, hits):
            return False
        if not self.running:
            return True
        # Beside running requests, keep a little room for their next decodes.
        return self.blocks.can_allocate(
            request.num_tokens + self._watermark_blocks * self.blocks.block_size, hits
        )

    def _admit(self, request: Request, hits: list[int]) -> None:
        self.waiting.remove(request)
        self.blocks.allocate(request.seq_id, request.num_tokens, hits)
        num_cached_tokens = len(hits) * self.blocks.block_size
        request.num_computed_tokens = num_cached_tokens
        if request.num_preemptions == 0 and request.num_output_tokens == 0:
            # The first admission (a request moved off a lost worker before it
            # sampled counts as one: it is prefilled from scratch there).
            request.cached_prompt_tokens = num_cached_tokens
        self.stats.prefix_cache_queries += request.num_tokens
        self.stats.prefix_cache_hits += num_cached_tokens
        request.status = RequestStatus.RUNNING
        request.sampled_since_admission = False
        bisect.insort(self.running, request, key=lambda r: r.running_order)
