"""Split schedulers (--api-processes N) for the integration tests: a stack whose scheduler
is a core with N API processes, what its log lines say about which process served
what, the processes of its session, and clients that each open a connection of their
own (so that SO_REUSEPORT spreads them over the API processes).

A scheduler's log goes to a file (LocalStack.scheduler_log): every line an API process
logs carries `api_process` (its index), which is how a test sees that both served.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx2 as httpx

from cbserve.client import build_request
from cbserve.connection import call_metadata
from cbserve.local_stack import LocalStack
from cbserve.retry import channel_options
from cbserve.v1 import generation_pb2_grpc as pb_grpc
from common.tls import channel_security, open_channel
from tests.integration.stacks import started_stack
from tests.waiting import wait_until

API_PROCESSES = 2
API_PROCESS_MODULE = "scheduler_svc.split.api_process"
# A null worker's step: long enough that a stream of a few hundred tokens is still
# running while a test signals, disconnects or counts; short enough for a fast suite.
NULL_STEP_MS = 4


def null_worker_args(step_ms: int = NULL_STEP_MS) -> list[str]:
    """A worker with no model whose every step takes step_ms (worker_svc/null)."""
    return ["--model-impl", "null", "--null-step-ms", str(step_ms)]


NULL_WORKER_ARGS = null_worker_args()


def split_stack(log_dir: Path, *, scheduler_args: tuple[str, ...] = (), **kwargs) -> LocalStack:
    """A started stack whose scheduler runs API_PROCESSES API processes (null workers
    unless worker_args say otherwise); its log lines in log_dir/scheduler.log."""
    kwargs.setdefault("worker_args", NULL_WORKER_ARGS)
    stack = started_stack(
        scheduler_args=["--api-processes", str(API_PROCESSES), *scheduler_args],
        scheduler_log=log_dir / "scheduler.log",
        # The scheduler starts while the workers load: the two overlap.
        workers_first=False,
        **kwargs,
    )
    assert f"api_processes={API_PROCESSES}" in stack.scheduler.wait_ready()
    # Ready once one worker answers: the tests want every one in the pool.
    wait_until(
        "every worker connected",
        lambda: stack.metrics()["cbserve_workers_connected"] == len(stack.workers),
    )
    return stack


def log_lines(stack: LocalStack) -> list[dict]:
    """The scheduler's JSON log lines so far (core and API processes together)."""
    lines = []
    for line in Path(stack.scheduler_log).read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written, or a traceback's
    return lines


def served_by(stack: LocalStack, request_ids, event: str = "request finished") -> Counter:
    """How many of these requests' `event` lines each API process logged, by index."""
    wanted = set(request_ids)
    return Counter(
        line["api_process"]
        for line in log_lines(stack)
        if line.get("event") == event and line.get("request_id") in wanted
    )


def _stat(pid_dir: Path) -> tuple[str, int] | None:
    """(state, session id) of a process, None if it is gone."""
    try:
        text = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # After the command's closing parenthesis: state, ppid, pgrp, session, ...
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def session_processes(session_id: int) -> list[int]:
    """The live (not zombie) processes of a session: LocalStack starts each child as
    the leader of its own, so the scheduler's pid names the core and every process it
    started, even one left behind by a core that is gone."""
    pids = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        stat = _stat(pid_dir)
        if stat is not None and stat[1] == session_id and stat[0] != "Z":
            pids.append(int(pid_dir.name))
    return pids


def api_process_pids(stack: LocalStack) -> list[int]:
    pids = []
    for pid in session_processes(stack.scheduler.process.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if API_PROCESS_MODULE.encode() in command:
            pids.append(pid)
    return pids


class OwnConnection:
    """A Generation stub (grpc.aio) on a TCP connection of its own: channels with equal
    arguments share one otherwise. No retries, so that refusals are seen."""

    def __init__(self, address: str, ca: Path | None = None, api_key: str | None = None):
        options = [*channel_options(None), ("grpc.use_local_subchannel_pool", 1)]
        security = None if ca is None else channel_security(ca)
        self.channel = open_channel(address, security, options, asyncio=True)
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.metadata = call_metadata(api_key)

    def generate(self, prompt: str, request_id: str = "", **sampling):
        request = build_request(prompt, request_id=request_id, **sampling)
        return self.stub.Generate(request, metadata=self.metadata, timeout=120)

    async def close(self) -> None:
        await self.channel.close()


def https_client(ca: Path, **kwargs) -> httpx.AsyncClient:
    """An HTTP client trusting the test CA; a new connection for each stream in flight."""
    return httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca)), **kwargs)


class Stream:
    """One Generate call on a connection of its own, read to its end by run(): its
    tokens, its finish reason or status, and when it ended."""

    def __init__(self, address: str, prompt: str = "Hello", **sampling) -> None:
        self._address = address
        self._request = (prompt, sampling)
        self.tokens: list[int] = []
        self.finish_reason: int | None = None
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.ended_at: float | None = None
        # Set at the first token (or the end): the request is live in the core.
        self.started = asyncio.Event()

    async def run(self) -> Stream:
        connection = OwnConnection(self._address)
        prompt, sampling = self._request
        try:
            async for response in connection.generate(prompt, **sampling):
                self.tokens.extend(response.token_ids)
                self.started.set()
                if response.finish_reason:
                    self.finish_reason = response.finish_reason
            self.code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as error:
            self.code, self.details = error.code(), error.details()
        finally:
            self.ended_at = time.monotonic()
            self.started.set()
            await connection.close()
        return self
