"""Stacks whose KV blocks are checked after every test (see conftest's no_leaked_blocks),
and waiting for a state of a stack's scheduler, read from its /metrics."""

from __future__ import annotations

from cbserve.local_stack import LocalStack
from tests.waiting import wait_until, wait_until_async

IDLE_TIMEOUT_S = 30.0
METRIC_TIMEOUT_S = 60.0
_BUSY_GAUGES = (
    "cbserve_num_requests_running",
    "cbserve_num_requests_waiting",
    "cbserve_kv_blocks_used",
)
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
    seen: dict[str, float] = {}

    def idle() -> bool:
        seen.update(stack.metrics())
        return not _busy(seen)

    wait_until(lambda: f"stack {stack.address} idle (busy: {_busy(seen)})", idle, timeout_s, 0.1)
    return seen


def _busy(metrics: dict[str, float]) -> dict[str, float]:
    return {name: metrics[name] for name in _BUSY_GAUGES if metrics[name] != 0}


def _metric_is(stack: LocalStack, name: str, value: float, seen: dict[str, float]):
    def check() -> bool:
        seen.update(stack.metrics())
        return seen[name] == value

    return (lambda: f"{name} == {value:g} (last seen {seen.get(name)})"), check


def wait_for_metric(
    stack: LocalStack, name: str, value: float, timeout_s: float = METRIC_TIMEOUT_S
) -> dict[str, float]:
    """Polls the scheduler's /metrics until `name` equals `value`; returns that sample."""
    seen: dict[str, float] = {}
    wait_until(*_metric_is(stack, name, value, seen), timeout_s)
    return seen


async def wait_for_metric_async(
    stack: LocalStack, name: str, value: float, timeout_s: float = METRIC_TIMEOUT_S
) -> dict[str, float]:
    """wait_for_metric while the event loop keeps reading the test's streams."""
    seen: dict[str, float] = {}
    await wait_until_async(*_metric_is(stack, name, value, seen), timeout_s)
    return seen


def running_stacks() -> list[LocalStack]:
    return [stack for stack in _started if stack.first_exit() is None]
