"""A cancel that arrives as the awaited thing completes is never lost.

asyncio.wait_for on Python 3.10/3.11 returns the result instead (gh-86296); a
worker's step loop then outlived its engine's stop(), and the scheduler's
removal of a worker that left DNS waited for ever (CI, test_worker_dns).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cbserve.worker.v1 import worker_pb2 as wpb
from common.cancel_safe import cancel_and_wait, done_within, set_within
from scheduler_svc.workers.client import WorkerClient


async def _cancel_as_it_completes(wait, complete) -> str:
    """Starts wait(), lets it block, then completes what it waits for and cancels
    it in the same loop iteration; says how the wait ended."""
    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    complete()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "returned"


def test_a_future_completing_with_the_cancel_still_cancels():
    async def scenario():
        future = asyncio.get_running_loop().create_future()
        ended = await _cancel_as_it_completes(
            lambda: done_within(future, 10.0), lambda: future.set_result(1)
        )
        assert ended == "cancelled"
        assert future.result() == 1  # the awaited future is left as it is

    asyncio.run(scenario())


def test_an_event_set_with_the_cancel_still_cancels():
    async def scenario():
        event = asyncio.Event()
        assert await _cancel_as_it_completes(lambda: set_within(event, 10.0), event.set) == (
            "cancelled"
        )

    asyncio.run(scenario())


def test_the_timeouts_report_what_happened():
    async def scenario():
        event = asyncio.Event()
        assert not await set_within(event, 0.01)
        event.set()
        assert await set_within(event, 0.01)
        future = asyncio.get_running_loop().create_future()
        assert not await done_within(future, 0.01)
        assert not future.cancelled()

    asyncio.run(scenario())


def test_a_worker_answer_meeting_the_cancel_does_not_keep_the_step_loop_alive():
    async def scenario():
        client = WorkerClient("127.0.0.1:1")
        answer = asyncio.get_running_loop().create_future()
        plan = SimpleNamespace(step_id=1, num_scheduled_tokens=1)
        ended = await _cancel_as_it_completes(
            lambda: client.result(plan, answer, 10.0),
            lambda: answer.set_result(wpb.StepResult(step_id=1)),
        )
        assert ended == "cancelled"

    asyncio.run(scenario())


def test_cancel_and_wait_ends_a_task_that_swallows_a_cancel():
    async def scenario():
        cancels_seen = 0

        async def stubborn():
            nonlocal cancels_seen
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    cancels_seen += 1
                    if cancels_seen >= 2:
                        raise

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task), 5.0)
        assert task.cancelled() and cancels_seen == 2

    asyncio.run(scenario())


def test_cancel_and_wait_retrieves_a_task_failure():
    async def scenario():
        async def fails():
            raise RuntimeError("boom")

        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait(task)  # does not raise
        assert isinstance(task.exception(), RuntimeError)

    asyncio.run(scenario())


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_done_within_returns_at_once_for_a_done_future(timeout_s):
    async def scenario():
        future = asyncio.get_running_loop().create_future()
        future.set_result("x")
        assert await done_within(future, timeout_s)

    asyncio.run(scenario())
