"""Cancellation: a client leaves at any point of its request's life."""

from __future__ import annotations

from scheduler_svc.core.request import FinishReason, RequestStatus

from .harness import Harness, make_request


def _assert_gone(harness: Harness, request) -> None:
    assert request.status is RequestStatus.FINISHED
    assert request.finish_reason is FinishReason.ABORT
    assert request not in harness.scheduler.running
    assert request not in harness.scheduler.waiting
    assert not harness.block_manager.has_blocks(request.seq_id)


def test_abort_while_waiting_never_reaches_the_worker():
    harness = Harness(max_num_seqs=1, max_num_batched_tokens=8)
    running = harness.add(make_request(prompt=4, max_tokens=4))
    waiting = harness.add(make_request(prompt=4, max_tokens=4))
    harness.step()
    harness.scheduler.abort_request(waiting.request_id)
    _assert_gone(harness, waiting)
    assert harness.scheduler.num_waiting == 0
    harness.run()
    assert all(waiting.seq_id not in plan.finished_seq_ids for plan in harness.worker.plans)
    assert waiting.request_id not in harness.outputs
    assert harness.final(running.request_id).finish_reason is FinishReason.LENGTH


def test_abort_mid_prefill_frees_its_blocks_and_tells_the_worker():
    harness = Harness(max_num_batched_tokens=8, num_blocks=16)
    request = harness.add(make_request(prompt=30, max_tokens=4))
    harness.step()
    # Admission took blocks for the whole prompt: 30 tokens in blocks of 4.
    assert request.num_computed_tokens == 8 and harness.block_manager.num_used_blocks == 8
    harness.scheduler.abort_request(request.request_id)
    _assert_gone(harness, request)
    assert harness.block_manager.num_used_blocks == 0
    assert not harness.scheduler.has_unfinished_requests()
    # Nothing to compute, but the worker must drop the sequence.
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [request.seq_id]
    assert not plan.new_sequences and not plan.continuing_sequences
    assert harness.worker.sequences == {}
    assert harness.step() is None


def test_abort_mid_decode_keeps_the_others_going():
    harness = Harness()
    doomed = harness.add(make_request(prompt=5, max_tokens=20))
    other = harness.add(make_request(prompt=5, max_tokens=6))
    for _ in range(3):
        harness.step()
    harness.scheduler.abort_request(doomed.request_id)
    _assert_gone(harness, doomed)
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [doomed.seq_id]
    assert [seq.seq_id for seq in plan.continuing_sequences] == [other.seq_id]
    harness.run()
    assert len(harness.outputs[doomed.request_id]) == 3
    assert not harness.finished(doomed.request_id)
    assert harness.final(other.request_id).completion_tokens == 6
    assert harness.block_manager.num_free_blocks == harness.block_manager.num_blocks


def test_abort_while_its_step_is_in_flight_ignores_the_token_it_samples():
    harness = Harness()
    doomed = harness.add(make_request(prompt=5, max_tokens=20))
    other = harness.add(make_request(prompt=5, max_tokens=3))
    plan = harness.scheduler.schedule()
    # The client goes away while the worker computes this step.
    harness.scheduler.abort_request(doomed.request_id)
    _assert_gone(harness, doomed)
    result = harness.worker.step(plan)
    assert doomed.seq_id in result.seq_ids
    outputs = harness.scheduler.update_from_output(plan, result)
    assert [output.request_id for output in outputs] == [other.request_id]
    assert doomed.num_output_tokens == 0
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [doomed.seq_id]
    harness.run()
    assert harness.worker.sequences == {}
    assert harness.block_manager.num_free_blocks == harness.block_manager.num_blocks


def test_abort_in_flight_on_the_step_that_would_have_finished_it():
    harness = Harness()
    request = harness.add(make_request(prompt=5, max_tokens=1))
    plan = harness.scheduler.schedule()
    harness.scheduler.abort_request(request.request_id)
    assert harness.scheduler.update_from_output(plan, harness.worker.step(plan)) == []
    assert request.finish_reason is FinishReason.ABORT
    assert list(harness.step().finished_seq_ids) == [request.seq_id]


def test_abort_is_safe_for_unknown_finished_and_repeated_ids():
    harness = Harness()
    harness.scheduler.abort_request("never-seen")
    request = harness.add(make_request(prompt=4, max_tokens=2))
    harness.run()
    assert harness.final(request.request_id).finish_reason is FinishReason.LENGTH
    harness.scheduler.abort_request(request.request_id)
    assert request.finish_reason is FinishReason.LENGTH
    assert harness.step() is None
    doomed = harness.add(make_request(prompt=4, max_tokens=8))
    harness.step()
    harness.scheduler.abort_request(doomed.request_id)
    harness.scheduler.abort_request(doomed.request_id)
    assert list(harness.step().finished_seq_ids) == [doomed.seq_id]
    assert harness.step() is None


def test_an_abort_makes_room_for_a_waiting_request():
    # `hog` fills 7 of the 8 blocks with its prompt and takes the last one when
    # it decodes; `waiting` needs 2 and has the same priority, so nothing is
    # preempted for it: it waits until the abort gives the blocks back.
    harness = Harness(num_blocks=8, block_size=4)
    hog = harness.add(make_request(prompt=28, max_tokens=4))
    waiting = harness.add(make_request(prompt=list(range(500, 508)), max_tokens=8))
    harness.step()
    harness.step()
    assert waiting.status is RequestStatus.WAITING
    assert harness.block_manager.num_free_blocks == 0
    harness.scheduler.abort_request(hog.request_id)
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [hog.seq_id]
    assert [seq.seq_id for seq in plan.new_sequences] == [waiting.seq_id]
    harness.run()
    assert harness.final(waiting.request_id).completion_tokens == 8
    assert hog.num_preemptions == 0
