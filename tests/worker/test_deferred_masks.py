"""Deferred masks on the worker: the forward runs, the sampler waits for the rows that a
later message brings (posted from another thread, as the Step stream's event loop
does); a row that does not come samples unmasked and is reported, never a failed step."""

from __future__ import annotations

import threading
import time

import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.errors import PlanError
from worker_svc.step.deferred_masks import MaskMailbox

from .test_null_runner import make_runner as make_null_runner
from .test_null_runner import new_seq
from .test_token_bitmask import mask_row

STREAM = 1


def masks_message(step_id: int, rows: dict) -> pb.StepPlan:
    message = pb.StepPlan(step_id=step_id)
    message.deferred_allowed_tokens.SetInParent()
    message.deferred_allowed_tokens.seq_ids.extend(rows)
    message.deferred_allowed_tokens.words = b"".join(
        row.astype("<i4").tobytes() for row in rows.values()
    )
    return message


def post_later(runner, message: pb.StepPlan, delay_s: float) -> threading.Thread:
    thread = threading.Timer(delay_s, runner.mailbox.post, (STREAM, message))
    thread.start()
    return thread


def deferred_decode(step_id: int, seq_ids, deferred, timeout_s: float = 5.0) -> pb.StepPlan:
    return pb.StepPlan(
        step_id=step_id,
        decode_seq_ids=list(seq_ids),
        deferred_mask_seq_ids=list(deferred),
        deferred_mask_timeout_seconds=timeout_s,
    )


def started_null_runner(step_ms: float = 0.0):
    runner = make_null_runner(step_ms=step_ms)
    runner.mailbox.reset(STREAM)
    runner.execute(
        pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [1, 3]), new_seq(2, 3, [2, 4])])
    )
    return runner


def test_the_sampler_waits_for_the_rows_after_the_forward():
    runner = started_null_runner(step_ms=20)
    late = post_later(runner, masks_message(2, {1: mask_row([5, 7], vocab=200)}), 0.06)
    started = time.perf_counter()
    result = runner.execute(deferred_decode(2, [1, 2], [1]))
    late.join()
    tokens = dict(zip(result.seq_ids, result.token_ids, strict=True))
    assert tokens[1] in (5, 7) and 100 <= tokens[2] < 140
    assert not result.mask_missing_seq_ids
    assert time.perf_counter() - started >= 0.05  # it waited for the late message


def test_a_row_that_never_comes_samples_unmasked_and_is_reported():
    runner = started_null_runner()
    result = runner.execute(deferred_decode(2, [1, 2], [1, 2], timeout_s=0.05))
    assert sorted(result.mask_missing_seq_ids) == [1, 2] and len(result.token_ids) == 2
    # The sequences stay consistent: the next plan (as the scheduler sent it before it
    # knew) decodes them, with its mask in time; the late message of step 2 is dropped.
    runner.mailbox.post(STREAM, masks_message(2, {1: mask_row([9], vocab=200)}))
    runner.mailbox.post(STREAM, masks_message(3, {1: mask_row([6], vocab=200)}))
    result = runner.execute(deferred_decode(3, [1, 2], [1]))
    assert dict(zip(result.seq_ids, result.token_ids, strict=True))[1] == 6
    assert not result.mask_missing_seq_ids


def test_a_message_without_a_row_fails_that_row_only():
    runner = started_null_runner()
    runner.mailbox.post(STREAM, masks_message(2, {2: mask_row([8], vocab=200)}))
    result = runner.execute(deferred_decode(2, [1, 2], [1, 2]))
    assert list(result.mask_missing_seq_ids) == [1]
    assert dict(zip(result.seq_ids, result.token_ids, strict=True))[2] == 8


def test_messages_of_an_older_stream_are_ignored():
    mailbox = MaskMailbox()
    mailbox.reset(2)
    mailbox.post(1, masks_message(5, {1: mask_row([1])}))
    assert mailbox.take(5, 0.01) is None
    mailbox.post(2, masks_message(5, {1: mask_row([1])}))
    assert list(mailbox.take(5, 0.01).seq_ids) == [1]


def test_the_reader_refuses_deferred_rows_out_of_protocol():
    runner = started_null_runner()
    with pytest.raises(PlanError, match="not in the plan"):
        runner.reader.read(deferred_decode(2, [1], [2]), runner.sequences)
    with pytest.raises(PlanError, match="one step only"):
        plan = deferred_decode(2, [1], [1])
        plan.num_steps = 2
        runner.reader.read(plan, runner.sequences)
    with pytest.raises(PlanError, match="both"):
        plan = deferred_decode(2, [1], [1])
        plan.allowed_tokens.seq_ids.append(1)
        plan.allowed_tokens.words = mask_row([1], vocab=200).astype("<i4").tobytes()
        runner.reader.read(plan, runner.sequences)
    step = runner.reader.read(deferred_decode(2, [1, 2], [2], timeout_s=0.5), runner.sequences)
    assert step.deferred_mask_seq_ids == {2} and step.deferred_mask_timeout_s == 0.5


def test_greedy_tokens_with_deferred_masks_equal_those_with_masks_in_the_plan(make_runner):
    """The real runner: the same rows, in the plan or after it, give the same tokens."""
    vocab = make_runner().loaded.vocab_size
    # Each step allows a different small set, so the mask decides what greedy takes.
    allowed = [mask_row(range(1000 + 37 * i, 1000 + 37 * i + 50), vocab) for i in range(6)]
    prompt = pb.NewSequence(
        seq_id=1,
        prompt_token_ids=[1, 504, 3458, 314, 253, 1345],
        num_scheduled_tokens=6,
        block_ids=[0],
        sampling=pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0),
    )
    runs = []
    for deferred in (False, True):
        runner = make_runner()
        runner.mailbox.reset(STREAM)
        first = pb.StepPlan(step_id=1, new_sequences=[prompt])
        first.allowed_tokens.seq_ids.append(1)
        first.allowed_tokens.words = allowed[0].astype("<i4").tobytes()
        tokens = list(runner.execute(first).token_ids)
        for step_id, row in enumerate(allowed[1:], start=2):
            if deferred:
                plan = deferred_decode(step_id, [1], [1])
                late = post_later(runner, masks_message(step_id, {1: row}), 0.01)
                result = runner.execute(plan)
                late.join()
                assert not result.mask_missing_seq_ids
            else:
                plan = pb.StepPlan(step_id=step_id, decode_seq_ids=[1])
                plan.allowed_tokens.seq_ids.append(1)
                plan.allowed_tokens.words = row.astype("<i4").tobytes()
                result = runner.execute(plan)
            tokens += result.token_ids
        runs.append(tokens)
    assert runs[0] == runs[1] and len(runs[0]) == len(allowed)
