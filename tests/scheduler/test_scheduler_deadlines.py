"""Deadlines: a request past its deadline is dropped wherever it is.

The scheduler reads an injected clock (the harness's FakeClock), so each
test says exactly when time passes. A dropped request is reported through
take_failed() with DEADLINE_EXCEEDED, its blocks are freed and the worker is
told to drop its sequence.
"""

from __future__ import annotations

import grpc

from scheduler_svc.core.request import FinishReason

from .books import check_books
from .harness import Harness, make_request, unique_prompt


def test_a_waiting_request_past_its_deadline_never_reaches_the_worker():
    harness = Harness(max_num_seqs=1)
    running = harness.add(make_request(prompt=unique_prompt(3), max_tokens=5))
    waiting = harness.add(make_request(prompt=unique_prompt(3), max_tokens=5, deadline=2.0))
    harness.step()
    harness.clock.advance(1.0)
    harness.step()
    assert waiting.request_id not in harness.errors  # 1.0 < 2.0
    harness.clock.advance(1.0)
    plan = harness.step()  # deadline == now: expired
    error = harness.errors[waiting.request_id]
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "while waiting" in error.message
    assert waiting.finish_reason is FinishReason.ABORT
    assert harness.scheduler.waiting == [] and not plan.finished_seq_ids
    harness.run()
    assert all(waiting.seq_id not in _seq_ids(plan) for plan in harness.worker.plans)
    assert waiting.request_id not in harness.outputs
    assert harness.final(running.request_id).completion_tokens == 5


def _seq_ids(plan) -> set[int]:
    """The plan's sequences, whether a core plan or the worker's message."""
    ids = {s.seq_id for s in [*plan.new_sequences, *plan.continuing_sequences]}
    return ids | set(getattr(plan, "decode_seq_ids", ()))


def test_a_running_request_past_its_deadline_is_dropped_and_its_blocks_freed():
    harness = Harness()
    doomed = harness.add(
        make_request(prompt=unique_prompt(9), max_tokens=50, deadline=3.0), tokens=[7, 8, 9]
    )
    other = harness.add(make_request(prompt=unique_prompt(5), max_tokens=6))
    for _ in range(3):
        harness.step()
        harness.clock.advance(1.0)
    assert harness.block_manager.block_table(doomed.seq_id)
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [doomed.seq_id]
    assert _seq_ids(plan) == {other.seq_id}
    error = harness.errors[doomed.request_id]
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "while running after 3 generated tokens" in error.message
    # Its client got the tokens before the deadline, and no final output.
    assert harness.token_ids(doomed.request_id) == [7, 8, 9]
    assert not harness.finished(doomed.request_id)
    assert not harness.block_manager.has_blocks(doomed.seq_id)
    check_books(harness.scheduler)
    harness.run()
    assert harness.final(other.request_id).completion_tokens == 6
    assert harness.block_manager.num_used_blocks == 0 and harness.worker.sequences == {}


def test_a_deadline_passing_while_the_step_is_in_flight_ends_it_at_the_next_schedule():
    harness = Harness()
    request = harness.add(make_request(prompt=unique_prompt(4), max_tokens=5, deadline=1.0))
    plan = harness.scheduler.schedule()
    harness.clock.advance(5.0)
    # The step was planned in time: its token is delivered.
    harness.deliver(harness.scheduler.update_from_output(plan, harness.worker.step(plan)))
    assert len(harness.token_ids(request.request_id)) == 1
    plan = harness.step()
    assert list(plan.finished_seq_ids) == [request.seq_id] and not _seq_ids(plan)
    assert harness.errors[request.request_id].code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_an_expired_request_is_reported_even_when_there_is_nothing_to_compute():
    harness = Harness()
    request = harness.add(make_request(prompt=unique_prompt(4), deadline=0.5))
    harness.clock.advance(1.0)
    assert harness.schedule() is None
    assert harness.errors[request.request_id].code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert not harness.scheduler.has_unfinished_requests()


def test_a_preempted_request_keeps_its_deadline():
    # 6 blocks, three requests of 2 blocks each: the third is preempted at the
    # third step and its deadline passes while it waits.
    harness = Harness(num_blocks=6)
    requests = [
        harness.add(make_request(prompt=unique_prompt(7), max_tokens=8, deadline=deadline))
        for deadline in (None, None, 4.0)
    ]
    for _ in range(3):
        harness.step()
        harness.clock.advance(1.0)
    assert requests[2].num_preemptions == 1
    harness.step()
    assert requests[2].request_id not in harness.errors
    harness.clock.advance(1.0)
    harness.run()
    error = harness.errors[requests[2].request_id]
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED and "while waiting" in error.message
    assert all(harness.finished(r.request_id) for r in requests[:2])
