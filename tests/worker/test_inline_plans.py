"""Which plans the worker's Step stream runs on the event loop's thread (small ones with
nothing queued before them) and which on the forward thread, and that results keep the
plans' order either way (worker_svc/servicer.py, runs_inline)."""

from __future__ import annotations

import asyncio
import threading

from cbserve.worker.v1 import worker_pb2
from worker_svc.metrics import WorkerMetrics
from worker_svc.servicer import INLINE_PLAN_ROWS, WorkerServicer, runs_inline


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
    def __init__(self):
        self.runner = _Runner()


class _Context:
    def peer(self):
        return "test"

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


def test_the_stream_runs_small_plans_on_the_loop_and_keeps_the_order():
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
