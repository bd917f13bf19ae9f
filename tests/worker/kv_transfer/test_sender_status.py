"""The status a failed transfer answers with (kv_transfer/sender.py): the scheduler
recomputes on UNAVAILABLE, so a destination that went away must read so however the
transport put it, and a destination's own refusal must keep its code."""

from __future__ import annotations

import grpc
import pytest

from common.grpc_status import CORE_INTERNAL_ERROR
from worker_svc.kv_transfer.sender import destination_status

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (Code.UNAVAILABLE, "failed to connect to all addresses"),
        (Code.CANCELLED, "Cancelled"),
        (Code.UNKNOWN, "Stream removed"),
        (Code.INTERNAL, CORE_INTERNAL_ERROR),  # the connection reset under the stream
    ],
)
def test_a_destination_that_went_away_reads_unavailable(code, details):
    assert destination_status(code, details) == Code.UNAVAILABLE


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (Code.FAILED_PRECONDITION, "the pool's layout differs"),
        (Code.INVALID_ARGUMENT, "a transfer without chunks"),
        (Code.INTERNAL, "step failed: RuntimeError()"),  # not the transport's own words
        (Code.RESOURCE_EXHAUSTED, "message larger than max"),
    ],
)
def test_a_refusal_keeps_its_code(code, details):
    assert destination_status(code, details) == code
