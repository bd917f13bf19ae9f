"""Stacks whose KV blocks are checked after every test (see conftest's no_leaked_blocks)."""

from __future__ import annotations

import time

from cbserve.local_stack import LocalStack

IDLE_TIMEOUT_S = 30.0
_started: list[LocalStack] = []


def started_stack(**kwargs):
    """A LocalStack whose blocks are checked after every test; use inside a fixture."""
    stack = LocalStack(**kwargs).start()
    _started.append(stack)
    return stack


def stop_stack(stack: LocalStack) -> None:
    _started.remove(stack)
    stack.stop()


def wait_until_idle(stack: LocalStack, timeout_s: float = IDLE_TIMEOUT_S) -> dict[str, float]:
    """Polls /metrics until nothing runs, waits or holds a block; returns the last sample."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = stack.metrics()
        busy = {
            name: metrics[name]
            for name in (
                "cbserve_num_requests_running",
                "cbserve_num_requests_waiting",
                "cbserve_kv_blocks_used",
            )
            if metrics[name] != 0
        }
        if not busy:
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"stack {stack.address} not idle after {timeout_s} s: {busy}")
        time.sleep(0.1)


def running_stacks() -> list[LocalStack]:
    return [stack for stack in _started if stack.first_exit() is None]
