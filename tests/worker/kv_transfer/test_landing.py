"""A transfer's landing against the steps (worker_svc/kv_transfer/landing.py): a step that
takes a block of a transfer still landing abandons it, waits for the write in flight,
and no chunk is written into its blocks afterwards."""

from __future__ import annotations

import threading
import time

import pytest

from worker_svc.kv_transfer.landing import Landing, Landings
from worker_svc.kv_transfer.layout import TransferError
from worker_svc.step.description import ContinuingSequence, NewSequence, Step


def _new(block_ids: tuple[int, ...]) -> NewSequence:
    return NewSequence(1, (5, 6), (), 0, 2, block_ids, sampling=None)


def test_a_step_that_takes_a_written_block_abandons_the_transfer():
    landing, writes = Landing(), []
    landing.write((3, 4), lambda: writes.append("first"))
    landing.take({9})  # another request's block: the transfer lives
    landing.write((5,), lambda: writes.append("second"))
    landing.take({4, 9})
    with pytest.raises(TransferError, match="gave the transfer up"):
        landing.write((6,), lambda: writes.append("late"))
    assert writes == ["first", "second"]


def test_a_chunk_whose_blocks_a_step_took_first_is_not_written():
    landing, writes = Landing(), []
    landing.take({7})
    with pytest.raises(TransferError):
        landing.write((7, 8), lambda: writes.append("late"))
    assert writes == [] and landing.abandoned


def test_a_step_waits_for_the_write_in_flight():
    landing, order = Landing(), []
    started = threading.Event()

    def slow_write() -> None:
        started.set()
        time.sleep(0.2)
        order.append("write")

    writer = threading.Thread(target=landing.write, args=((1, 2), slow_write))
    writer.start()
    started.wait(5)
    landing.take({2})
    order.append("step")
    writer.join(5)
    assert order == ["write", "step"]


def test_the_steps_new_blocks_are_taken_from_every_live_landing_only():
    landings = Landings()
    live, done = landings.open(), landings.open()
    live.write((10, 11), lambda: None)
    done.write((12,), lambda: None)
    landings.close(done)
    step = Step(
        step_id=1,
        new_sequences=(_new((12, 20)),),
        continuing_sequences=(ContinuingSequence(2, 1, (11,)),),
    )
    landings.take_step_blocks(step)
    assert live.abandoned and live.taken == {11, 12, 20}
    assert not done.abandoned and done.taken == set()
