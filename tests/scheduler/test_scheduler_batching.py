"""Static batching (the benchmark's baseline) and the admission watermark."""

from __future__ import annotations

from scheduler_svc.core.request import RequestStatus

from .harness import Harness, make_request, unique_prompt


def _new_seq_ids(plan) -> list[int]:
    return [seq.seq_id for seq in plan.new_sequences]


def test_static_batching_admits_a_whole_batch_and_nobody_joins_it():
    harness = Harness(batching="static", max_num_batched_tokens=8)
    batch = [harness.add(make_request(prompt=unique_prompt(6), max_tokens=n)) for n in (2, 4, 6)]
    plan = harness.step()
    # All admitted at once, prefilled over the next steps inside the budget.
    assert all(r.status is RequestStatus.RUNNING for r in batch)
    assert _new_seq_ids(plan) == [batch[0].seq_id, batch[1].seq_id]
    late = harness.add(make_request(prompt=unique_prompt(2), max_tokens=2))
    urgent = harness.add(make_request(prompt=unique_prompt(2), max_tokens=2, priority=-5))
    while any(r.status is RequestStatus.RUNNING for r in batch):
        plan = harness.step()
        # There is room and budget, and `urgent` outranks the batch: still no.
        assert late.seq_id not in _new_seq_ids(plan)
        assert urgent.seq_id not in _new_seq_ids(plan)
    assert harness.scheduler.stats.num_preemptions == 0
    plan = harness.step()
    assert _new_seq_ids(plan) == [urgent.seq_id, late.seq_id]
    harness.run()
    assert all(harness.finished(r.request_id) for r in (*batch, late, urgent))


def test_continuous_batching_lets_the_same_request_join_a_running_batch():
    harness = Harness(max_num_batched_tokens=8)
    batch = [harness.add(make_request(prompt=unique_prompt(6), max_tokens=n)) for n in (2, 4, 6)]
    harness.step()
    late = harness.add(make_request(prompt=unique_prompt(2), max_tokens=2))
    while late.status is RequestStatus.WAITING:
        harness.step()
    # It joined as soon as the budget had room, beside the batch's decodes.
    assert len(harness.worker.plans) == 3
    assert [r.status for r in batch[1:]] == [RequestStatus.RUNNING] * 2


def _beside_a_runner(watermark: float) -> tuple[Harness, object]:
    # 8 blocks: the runner holds 3; the newcomer needs 4 of the 5 left.
    harness = Harness(num_blocks=8, watermark=watermark)
    harness.add(make_request(prompt=unique_prompt(9), max_tokens=3))
    harness.step()
    newcomer = harness.add(make_request(prompt=unique_prompt(16), max_tokens=2))
    harness.step()
    return harness, newcomer


def test_the_watermark_keeps_blocks_free_for_the_running_requests_decodes():
    harness, newcomer = _beside_a_runner(watermark=0.0)
    assert newcomer.status is RequestStatus.RUNNING
    # 25% of 8 blocks = 2 kept free: 4 + 2 > 5, so it waits for the runner.
    harness, newcomer = _beside_a_runner(watermark=0.25)
    assert newcomer.status is RequestStatus.WAITING
    harness.run()
    assert harness.finished(newcomer.request_id)
    assert harness.scheduler.stats.num_preemptions == 0


def test_the_watermark_does_not_apply_when_nothing_runs():
    harness = Harness(num_blocks=8, watermark=0.5)
    whole_pool = harness.add(make_request(prompt=unique_prompt(32), max_tokens=1))
    harness.step()
    assert harness.finished(whole_pool.request_id)
