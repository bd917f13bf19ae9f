"""Helpers for the worker liveness tests: reading the scheduler's view of its
workers from /metrics, timing how long it takes to notice a fault, restarting a
worker, and streaming greedy requests while counting their progress."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from cbserve.client import AsyncClient
from cbserve.local_stack import ChildProcess, LocalStack
from tests import waiting

GREEDY = {"temperature": 0.0, "ignore_eos": True}
# The workers of the fault tests: one thread each (two processes spinning in OpenMP on
# two cores are many times slower), a small pool; and how soon a lost one is found.
WORKER_ARGS = ["--dtype", "float32", "--threads", "1", "--num-kv-blocks", "256"]
WORKER_TIMEOUT_S = 3.0
LOSS_CAUSES = ("disconnected", "keepalive", "step_timeout", "protocol")
FAULT_WAIT_S = 120.0
# Restarted workers are started from this one thread, alive as long as the tests: a
# child asks for SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG in
# common.parent_watch), so one started from asyncio.to_thread's thread would be
# stopped when asyncio.run shuts that thread down at the end of the scenario.
_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="worker-launcher")


def worker_connected(stack: LocalStack, worker: str) -> bool:
    return stack.metrics().get(f'cbserve_worker_connected{{worker="{worker}"}}', 0.0) == 1.0


def workers_connected(stack: LocalStack) -> int:
    return int(stack.metrics()["cbserve_workers_connected"])


def losses(stack: LocalStack) -> dict[str, float]:
    """cbserve_worker_lost_total by cause."""
    metrics = stack.metrics()
    return {
        cause: metrics[f'cbserve_worker_lost_total{{cause="{cause}"}}'] for cause in LOSS_CAUSES
    }


def restart_worker(stack: LocalStack, index: int) -> None:
    """A new worker process on the port of worker `index` (killed first, if alive)."""
    old = stack.workers[index]
    old.stop(signal.SIGKILL)
    stack.workers[index] = _LAUNCHER.submit(ChildProcess, old.name, old.argv).result()
    stack.workers[index].wait_ready()


def bring_back_workers(stack: LocalStack) -> None:
    """Restarts every worker of the stack that a test before left dead, resumes any it
    left stopped, and waits until the scheduler has each of them connected."""
    for index, worker in enumerate(stack.workers):
        if worker.process.poll() is not None:
            restart_worker(stack, index)
        else:
            worker.process.send_signal(signal.SIGCONT)
    wait_until(
        "every worker connected",
        lambda: all(worker_connected(stack, f"{stack.host}:{port}") for port in stack.worker_ports),
    )


def requests_recomputed(stack: LocalStack) -> float:
    return stack.metrics()["cbserve_requests_recomputed_total"]


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = FAULT_WAIT_S) -> float:
    """tests.waiting.wait_until (every 50 ms; returns the seconds it took), bounded for
    a worker that comes back: a restarted one loads the model first."""
    return waiting.wait_until(what, check, timeout_s)


@dataclass
class Outcome:
    """One streamed request: its tokens, and how it ended (a finish reason or a status)."""

    tokens: list[int] = field(default_factory=list)
    # One TokenLogprob per token, when the request asked for logprobs.
    logprobs: list = field(default_factory=list)
    finish_reason: int | None = None
    code: grpc.StatusCode | None = None
    seconds: float = 0.0


# A text prompt, or build_request's prompt arguments ({"chat": [...]}, {"token_ids": ...}).
Prompt = str | dict


async def stream(client: AsyncClient, prompt: Prompt, outcome: Outcome, progress=None, **sampling):
    """Streams one request into outcome; progress(outcome) after every response."""
    started = time.monotonic()
    request = {"prompt": prompt} if isinstance(prompt, str) else prompt
    try:
        async for response in client.generate(**request, **sampling):
            outcome.tokens.extend(response.token_ids)
            outcome.logprobs.extend(response.logprobs)
            if response.finish_reason:
                outcome.finish_reason = response.finish_reason
            if progress is not None:
                progress(outcome)
        outcome.code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as error:
        outcome.code = error.code()
    finally:
        outcome.seconds = time.monotonic() - started


def run_greedy(
    address: str,
    prompts: list[Prompt],
    max_tokens: int,
    fault=None,
    after_tokens=3,
    **sampling,
):
    """Streams every prompt at once (greedy, plus `sampling`: logprobs=5, say); calls
    fault() (in a thread) once every stream has after_tokens tokens. Returns the
    outcomes, and the tokens each stream had when the fault came."""

    async def scenario():
        outcomes = [Outcome() for _ in prompts]
        ready = asyncio.Event()

        def progress(_):
            if all(len(o.tokens) >= after_tokens or o.code for o in outcomes):
                ready.set()

        async with AsyncClient(address) as client:
            tasks = [
                asyncio.create_task(
                    stream(
                        client,
                        prompt,
                        outcome,
                        progress,
                        max_tokens=max_tokens,
                        timeout=300,
                        **GREEDY,
                        **sampling,
                    )
                )
                for prompt, outcome in zip(prompts, outcomes, strict=True)
            ]
            at_fault = None
            if fault is not None:
                await asyncio.wait_for(ready.wait(), 300)
                at_fault = [len(o.tokens) for o in outcomes]
                await asyncio.to_thread(fault)
            await asyncio.gather(*tasks)
        return outcomes, at_fault

    return asyncio.run(scenario())
