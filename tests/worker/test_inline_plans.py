"""Which plans the worker's Step stream runs on the event loop's thread (small ones with
nothing queued before them) and which on the forward thread, that results keep the
plans' order either way, and where the stream's reads and writes go around a step run on
the loop, serial or overlapped (worker_svc/step_placement.py)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from cbserve.worker.v1 import worker_pb2
from worker_svc.metrics import WorkerMetrics
from worker_svc.servicer import WorkerServicer
from worker_svc.step_placement import (
    INLINE_PLAN_ROWS,
    overlaps_step_io,
    runs_inline,
    usable_cores,
)


def decodes(n: int, **fields) -> worker_pb2.StepPlan:
    return worker_pb2.StepPlan(decode_seq_ids=list(range(n)), **fields)


def test_a_few_decodes_run_inline():
    assert runs_inline(decodes(1), queued=0)
    assert runs_inline(decodes(INLINE_PLAN_ROWS), queued=0)


def test_bigger_plans_queued_plans_and_deferred_masks_do_not():
    assert not runs_inline(decodes(INLINE_PLAN_ROWS + 1), queued=0)
    assert not runs_inline(decodes(1), queued=1)  # the forward thread has one before it
    assert not runs_inline(decodes(1, deferred_mask_seq_ids=[0]), queued=0)


def test_rows_count_prompt_tokens_drafts_and_steps():
    prompt = worker_pb2.StepPlan(
        new_sequences=[worker_pb2.NewSequence(seq_id=1, num_scheduled_tokens=INLINE_PLAN_ROWS)]
    )
    assert runs_inline(prompt, queued=0)
    prompt.new_sequences[0].num_scheduled_tokens += 1
    assert not runs_inline(prompt, queued=0)
    drafts = worker_pb2.StepPlan(
        continuing_sequences=[
            worker_pb2.ContinuingSequence(
                seq_id=1, num_scheduled_tokens=1, num_draft_tokens=INLINE_PLAN_ROWS
            )
        ]
    )
    assert not runs_inline(drafts, queued=0)
    assert runs_inline(decodes(2, num_steps=INLINE_PLAN_ROWS // 2), queued=0)
    assert not runs_inline(decodes(2, num_steps=INLINE_PLAN_ROWS // 2 + 1), queued=0)


class _Mailbox:
    def reset(self, stream):
        pass

    def post(self, stream, plan):
        pass


class _Runner:
    """Records the thread each plan ran on; a big plan takes a while, so that the plan
    sent after it finds it still running."""

    def __init__(self):
        self.mailbox = _Mailbox()
        self.threads: dict[int, str] = {}

    def reset(self):
        pass

    def execute(self, plan):
        self.threads[plan.step_id] = threading.current_thread().name
        if len(plan.decode_seq_ids) > INLINE_PLAN_ROWS:
            threading.Event().wait(0.2)
        return worker_pb2.StepResult(step_id=plan.step_id)


class _Worker:
    """As a 2-core machine's worker with 2 step threads: serial I/O (step_placement)."""

    def __init__(self, threads: int = 2, device: str = "cpu"):
        self.runner = _Runner()
        self.threads = threads
        self.description = worker_pb2.WorkerDescription(device=device)


class _Context:
    def peer(self):
        return "test"

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


@pytest.mark.parametrize("overlap_io", [False, True])
def test_the_stream_runs_small_plans_on_the_loop_and_keeps_the_order(overlap_io):
    plans = [
        decodes(1, step_id=1),
        decodes(INLINE_PLAN_ROWS + 1, step_id=2),  # the forward thread
        decodes(1, step_id=3),  # sent while 2 runs: queued behind it, same thread
        decodes(1, step_id=4),  # sent once the forward thread is idle
    ]
    worker = _Worker()

    async def requests():
        for plan in plans:
            yield plan
            if plan.step_id == 2:
                await asyncio.sleep(0.05)  # 3 arrives while 2 runs
            if plan.step_id == 3:
                await asyncio.sleep(0.4)  # 4 after 2 and 3 are done

    async def run():
        servicer = WorkerServicer(WorkerMetrics("test"))
        servicer.set_ready(worker)
        servicer.overlap_io = overlap_io
        try:
            results = [r.step_id async for r in servicer.Step(requests(), _Context())]
        finally:
            servicer.executor.shutdown(wait=True)
        return threading.current_thread().name, results

    loop_thread, results = asyncio.run(run())
    assert results == [1, 2, 3, 4]
    threads = worker.runner.threads
    assert threads[1] == loop_thread
    assert threads[2] != loop_thread and threads[3] == threads[2]
    assert threads[4] == loop_thread  # nothing queued any more: inline again


class _RecordingRunner(_Runner):
    def __init__(self, events: list[str]):
        super().__init__()
        self.events = events

    def execute(self, plan):
        self.events.append(f"run {plan.step_id}")
        return super().execute(plan)


def _events_of_one_stream(overlap_io: bool) -> list[str]:
    """Three one-row plans, all sent at once (as async scheduling keeps the next one
    waiting); what the stream did, in order: reads of the request stream, steps run,
    results handed on."""
    events: list[str] = []
    worker = _Worker()
    worker.runner = _RecordingRunner(events)

    async def requests():
        for step_id in (1, 2, 3):
            events.append(f"read {step_id}")
            yield decodes(1, step_id=step_id)

    async def run():
        servicer = WorkerServicer(WorkerMetrics("test"))
        servicer.set_ready(worker)
        servicer.overlap_io = overlap_io
        try:
            async for result in servicer.Step(requests(), _Context()):
                events.append(f"result {result.step_id}")
        finally:
            servicer.executor.shutdown(wait=True)

    asyncio.run(run())
    return events


def test_overlapped_the_next_read_and_the_last_result_go_before_the_step():
    events = _events_of_one_stream(overlap_io=True)
    assert [e for e in events if e.startswith("result")] == ["result 1", "result 2", "result 3"]
    # Plan 2's step runs after plan 3's read was posted and plan 1's result handed on.
    assert events.index("read 3") < events.index("run 2")
    assert events.index("result 1") < events.index("run 2")
    assert events.index("result 2") < events.index("run 3")


def test_serial_each_step_runs_at_once_and_its_result_goes_before_the_next_read():
    events = _events_of_one_stream(overlap_io=False)
    for step_id in (1, 2):
        assert events.index(f"run {step_id}") < events.index(f"result {step_id}")
        assert events.index(f"result {step_id}") < events.index(f"read {step_id + 1}")


def test_overlap_only_where_the_step_leaves_grpc_a_core():
    assert not overlaps_step_io(2, "cpu", cores=2)
    assert overlaps_step_io(1, "cpu", cores=2)
    assert not overlaps_step_io(4, "cpu", cores=4)
    assert overlaps_step_io(8, "cuda:0", cores=4)  # the step's work is on the GPU
    assert not overlaps_step_io(1, "none", cores=2)  # a null worker computes nothing
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
