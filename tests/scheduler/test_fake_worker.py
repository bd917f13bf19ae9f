"""The fake worker's KV checks catch what they claim to, on hand-built plans.

The randomized tests rely on them to prove the prefix cache and recompute
right, so a check that never fires would make those tests prove nothing.
"""

from __future__ import annotations

import pytest

from cbserve.worker.v1 import worker_pb2 as wpb
from scheduler_svc.core.block_manager import BlockManager

from .fake_worker import FakeWorker, ProtocolViolation
from .harness import Harness, make_request, unique_prompt


def _worker() -> FakeWorker:
    return FakeWorker(num_blocks=4, block_size=2, script=lambda *_: 7)


def _new(seq_id, prompt, block_ids, computed=0, scheduled=None, output=()):
    return wpb.NewSequence(
        seq_id=seq_id,
        prompt_token_ids=prompt,
        output_token_ids=output,
        num_computed_tokens=computed,
        num_scheduled_tokens=scheduled if scheduled is not None else len(prompt) - computed,
        block_ids=block_ids,
    )


def test_a_hit_must_find_the_sequences_own_kv():
    worker = _worker()
    worker.step_proto(wpb.StepPlan(step_id=1, new_sequences=[_new(1, [5, 6, 8], [0, 1])]))
    # Same first block: found, only the rest is computed.
    worker.step_proto(
        wpb.StepPlan(step_id=2, new_sequences=[_new(2, [5, 6, 9], [0, 2], computed=2)])
    )
    # Same tokens at a different position, or after different tokens: not its KV.
    with pytest.raises(ProtocolViolation, match="not its own KV"):
        worker.step_proto(
            wpb.StepPlan(step_id=3, new_sequences=[_new(3, [6, 8, 1], [1, 3], computed=2)])
        )
    with pytest.raises(ProtocolViolation, match="not its own KV"):
        worker.step_proto(
            wpb.StepPlan(step_id=4, new_sequences=[_new(4, [5, 6, 1], [3, 2], computed=2)])
        )


def test_writing_into_a_block_that_live_sequences_share_is_refused():
    worker = _worker()
    worker.step_proto(wpb.StepPlan(step_id=1, new_sequences=[_new(1, [5, 6, 8], [0, 1])]))
    # Sequence 2 holds block 1 too, and would write its third token there.
    with pytest.raises(ProtocolViolation, match="2 live sequences share"):
        worker.step_proto(
            wpb.StepPlan(step_id=2, new_sequences=[_new(2, [5, 6, 8], [0, 1], computed=2)])
        )


def test_a_block_held_twice_by_one_sequence_is_refused():
    with pytest.raises(ProtocolViolation, match="holds a block twice"):
        _worker().step_proto(wpb.StepPlan(step_id=1, new_sequences=[_new(1, [5, 6, 8], [0, 0])]))


def test_a_prefix_cache_that_forgets_to_unregister_evicted_blocks_is_caught(monkeypatch):
    # Break eviction: an overwritten block stays findable under its old hash,
    # with its old tokens, so that even the token comparison on a hit passes.
    def take_without_unregistering(self):
        block_id, _ = self._free.popitem(last=False)
        self._blocks[block_id].ref_count = 1
        return block_id

    monkeypatch.setattr(BlockManager, "_take_free_block", take_without_unregistering)
    harness = Harness(num_blocks=2, block_size=4)
    prompt = unique_prompt(5)
    harness.add(make_request(prompt=prompt, max_tokens=1))
    harness.run()
    # Takes the emptied block, then the cached one, and writes tokens 4 and 5
    # there (a partial block, which is never registered under a new hash).
    harness.add(make_request(prompt=unique_prompt(6), max_tokens=1))
    harness.run()
    harness.add(make_request(prompt=prompt, max_tokens=1))
    with pytest.raises(ProtocolViolation, match="not its own KV"):
        harness.run()


def test_a_multi_step_plan_must_give_blocks_for_every_step():
    worker = _worker()
    worker.step_proto(wpb.StepPlan(step_id=1, new_sequences=[_new(1, [5, 6, 8], [0, 1])]))
    decode = wpb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1)
    # 3 tokens computed + 3 steps = 6 tokens of KV; blocks 0 and 1 hold 4.
    with pytest.raises(ProtocolViolation, match="cannot hold 5 tokens"):
        worker.step_proto(wpb.StepPlan(step_id=2, num_steps=3, continuing_sequences=[decode]))


def test_a_multi_step_plan_with_a_prefill_is_refused():
    plan = wpb.StepPlan(step_id=1, num_steps=2, new_sequences=[_new(1, [5, 6, 8], [0, 1])])
    with pytest.raises(ProtocolViolation, match="new sequences in a multi-step plan"):
        _worker().step_proto(plan)
