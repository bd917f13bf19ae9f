"""The scheduler's bookkeeping invariants, checked from the outside after any step.

Each count is recomputed from the blocks themselves rather than read back
from the block manager's own counters, so that a counter that drifts from
the truth is caught too.
"""

from __future__ import annotations

from collections import Counter

from scheduler_svc.core.prefix_hash import block_hash
from scheduler_svc.core.request import RequestStatus
from scheduler_svc.core.scheduler import Scheduler


def check_books(scheduler: Scheduler) -> None:
    _check_blocks(scheduler)
    _check_queues(scheduler)


def _check_blocks(scheduler: Scheduler) -> None:
    manager = scheduler.block_manager
    # Only running requests hold block tables.
    tables = {request.seq_id: manager.block_table(request.seq_id) for request in scheduler.running}
    assert set(manager.seq_ids) == set(tables), "a block table without a running request"
    holders: Counter[int] = Counter()
    for seq_id, table in tables.items():
        assert len(set(table)) == len(table), f"sequence {seq_id} holds a block twice"
        holders.update(table)
    # A block is owned by several tables only through its reference count.
    for block_id in range(manager.num_blocks):
        assert manager.ref_count(block_id) == holders[block_id], (
            f"block {block_id}: ref count {manager.ref_count(block_id)}, "
            f"held by {holders[block_id]} tables"
        )
    # Every block is exactly one of used, cached (free, findable) and empty.
    used = sum(1 for b in range(manager.num_blocks) if manager.ref_count(b) > 0)
    cached = sum(
        1
        for b in range(manager.num_blocks)
        if manager.ref_count(b) == 0 and manager.block_hash(b) is not None
    )
    empty = manager.num_blocks - used - cached
    assert (manager.num_used_blocks, manager.num_cached_blocks) == (used, cached)
    assert manager.num_free_blocks == empty + cached
    if not manager.enable_prefix_caching:
        assert cached == 0 and all(manager.block_hash(b) is None for b in holders)
    # A shared block must be a full, computed, registered one: nobody writes it.
    for block_id, count in holders.items():
        if count > 1:
            assert manager.block_hash(block_id) is not None, f"block {block_id} shared unhashed"
    _check_hashes(scheduler)


def _check_hashes(scheduler: Scheduler) -> None:
    """A registered block is the chained hash of the tokens of its holders."""
    manager = scheduler.block_manager
    size = manager.block_size
    for request in scheduler.running:
        table = manager.block_table(request.seq_id)
        tokens = request.all_token_ids
        parent = None
        for index, block_id in enumerate(table):
            registered = manager.block_hash(block_id)
            expected = block_hash(parent, tokens[index * size : (index + 1) * size])
            if registered is not None:
                assert (index + 1) * size <= request.num_computed_tokens, (
                    f"{request.request_id}: block {block_id} is registered before it is computed"
                )
                assert registered == expected, f"{request.request_id}: block {block_id} hash"
            parent = expected


def _check_queues(scheduler: Scheduler) -> None:
    manager = scheduler.block_manager
    config = scheduler.config
    assert len(scheduler.running) <= config.max_running_seqs
    assert not set(map(id, scheduler.running)) & set(map(id, scheduler.waiting))
    assert scheduler.running == sorted(scheduler.running, key=lambda r: r.running_order)
    assert scheduler.waiting == sorted(scheduler.waiting, key=lambda r: r.waiting_order)
    # Speculative decoding plans up to 1 + K samples a decode, and the blocks of
    # rejected drafts stay with the request (written again by later steps).
    speculative = config.speculative if scheduler.speculation is not None else None
    drafts = speculative.num_speculative_tokens if speculative else 0
    for request in scheduler.running:
        assert request.status is RequestStatus.RUNNING
        table = manager.block_table(request.seq_id)
        # Admission gives blocks for every current token; growth follows the
        # computed ones. So KV never lacks a block, nor has one past the tokens.
        # (With async scheduling the tokens include those a plan in flight samples.)
        assert manager.blocks_needed(request.num_computed_tokens) <= len(table)
        assert len(table) <= manager.blocks_needed(request.num_planned_tokens + drafts)
        assert request.num_computed_tokens <= request.num_planned_tokens
        most_pending = scheduler.max_in_flight * max(config.num_scheduler_steps, 1 + drafts)
        assert 0 <= request.num_pending_samples <= most_pending
        if not request.sampled_since_admission:
            assert len(table) >= manager.blocks_needed(request.num_tokens)
    for request in [*scheduler.running, *scheduler.waiting]:
        # The stated bound: every preemption is paid for by a generated token.
        assert request.num_preemptions <= request.num_output_tokens, request.request_id
        assert request.error is None and request.finish_reason is None
    for request in scheduler.waiting:
        assert request.status is RequestStatus.WAITING
        assert request.num_computed_tokens == 0 and not request.seen_by_worker
        assert request.num_pending_samples == 0
    if not scheduler.has_unfinished_requests():
        assert manager.num_used_blocks == 0
