"""One scheduler and its workers as child processes on this machine.

Used by `make run` / `cbserve serve` and by the integration tests, so the
tests start the service exactly as a person does. Children are started in
their own process group and always stopped: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from cbserve.ports import free_port
from common import parent_watch
from common.metrics import parse_samples

READY_TIMEOUT_S = 300.0
# After SIGTERM, how long a child may take beyond its --grace-period before SIGKILL.
STOP_TIMEOUT_S = 10.0
# The --grace-period LocalStack gives its children: short, so that stopping a stack
# with requests still in flight (a test's teardown, Ctrl-C) does not wait 30 s.
DEFAULT_GRACE_PERIOD_S = 2.0


class ChildProcess:
    """A child whose stdout is watched for its ready line; stderr passes through (or goes
    to a file, stderr_path)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        stderr_path: str | os.PathLike | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.lines: list[str] = []
        self._ready = threading.Event()
        with contextlib.ExitStack() as opened:
            # The child gets its own descriptor: ours is closed once it is started.
            stderr = None if stderr_path is None else opened.enter_context(open(stderr_path, "a"))
            self.process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                # The child arms its own death signal (common.parent_watch).
                env={**os.environ, **(env or {}), parent_watch.ENV_VAR: str(os.getpid())},
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if " ready " in line:
                self._ready.set()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.2):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.process.returncode} before ready"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s")
        return next(line for line in self.lines if " ready " in line)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Sends sig, waits timeout_s for the exit, then SIGKILL; returns the exit code."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        return self.process.wait()


@dataclass
class LocalStack:
    """Scheduler + workers; `with LocalStack(...) as stack:` starts and stops them."""

    num_workers: int = 1
    # How many of the workers (the last ones) are --prefill-worker workers.
    num_prefill_workers: int = 0
    scheduler_port: int = 0
    # Ports here are the stack's, not flags: None is off, 0 picks a free port.
    # Where the scheduler serves /metrics: a free port unless given.
    metrics_port: int | None = 0
    # The scheduler's OpenAI-compatible HTTP front: off unless asked for, so that tests
    # never take `cbserve serve`'s fixed 8000.
    http_port: int | None = None
    worker_ports: list[int] = field(default_factory=list)
    # Where each worker serves its own /metrics (worker i: the i-th): none unless given;
    # a 0 in it picks a free port.
    worker_metrics_ports: list[int] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    scheduler_args: list[str] = field(default_factory=list)
    # Variables for the scheduler only: API keys go this way, not on its command line,
    # where any user of the host could read them (ps, /proc/PID/cmdline).
    scheduler_env: dict[str, str] = field(default_factory=dict)
    # A file for the scheduler's stderr (its JSON log lines), for tests that read them;
    # None: this process's stderr.
    scheduler_log: str | os.PathLike | None = None
    host: str = "127.0.0.1"
    # --grace-period of every child, unless its args set one.
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    # Start the scheduler only once every worker is ready (the tests' default: every
    # worker is in the pool from the first request on), or all at once (`cbserve serve`:
    # the scheduler loads its tokenizer while the workers load the model, and serves
    # as soon as one worker answers).
    workers_first: bool = True
    workers: list[ChildProcess] = field(default_factory=list, init=False)
    scheduler: ChildProcess | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.scheduler_port = self.scheduler_port or free_port()
        if self.metrics_port == 0:
            self.metrics_port = free_port()
        if self.http_port == 0:
            self.http_port = free_port()
        while len(self.worker_ports) < self.num_workers:
            self.worker_ports.append(free_port())
        self.worker_metrics_ports = [port or free_port() for port in self.worker_metrics_ports]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.scheduler_port}"

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_port is None:
            return None
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def worker_metrics_url(self, index: int) -> str:
        return f"http://{self.host}:{self.worker_metrics_ports[index]}/metrics"

    @property
    def http_url(self) -> str | None:
        """The HTTP front's root (append /v1 for the OpenAI API), None when it is off."""
        if self.http_port is None:
            return None
        scheme = "https" if "--tls-cert" in self.scheduler_args else "http"
        return f"{scheme}://{self.host}:{self.http_port}"

    def metrics(self, timeout_s: float = 5.0) -> dict[str, float]:
        """The scheduler's current metrics: sample (with labels, as written) -> value."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as response:
            return parse_samples(response.read().decode())

    def start(self) -> LocalStack:
        try:
            for index in range(len(self.worker_ports)):
                self.workers.append(ChildProcess(f"worker{index}", self.worker_argv(index)))
            if self.workers_first:
                for worker in self.workers:
                    worker.wait_ready()
            self.scheduler = ChildProcess(
                "scheduler",
                self.scheduler_argv(),
                env=self.scheduler_env,
                stderr_path=self.scheduler_log,
            )
            self.scheduler.wait_ready()
            for worker in self.workers:
                worker.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def worker_argv(self, index: int) -> list[str]:
        argv = [sys.executable, "-m", "worker_svc", "--host", self.host]
        argv += ["--port", str(self.worker_ports[index])]
        if index < len(self.worker_metrics_ports):
            argv += ["--metrics-port", str(self.worker_metrics_ports[index])]
        return argv + self._grace_args(self.worker_args) + self.worker_args

    def scheduler_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "scheduler_svc", "--host", self.host]
        argv += ["--port", str(self.scheduler_port)]
        # Off is said outright: the scheduler's own default is on (9090).
        argv += ["--metrics-port", str(self.metrics_port or 0)]
        if self.http_port is not None:
            argv += ["--http-port", str(self.http_port)]
        first_prefill = len(self.worker_ports) - self.num_prefill_workers
        for index, port in enumerate(self.worker_ports):
            kind = "--prefill-worker" if index >= first_prefill else "--worker"
            argv += [kind, f"{self.host}:{port}"]
        return argv + self._grace_args(self.scheduler_args) + self.scheduler_args

    def _grace_args(self, args: list[str]) -> list[str]:
        if any(arg.startswith("--grace-period") for arg in args):
            return []
        return ["--grace-period", str(self.grace_period_s)]

    def children(self) -> list[ChildProcess]:
        return [*([self.scheduler] if self.scheduler else []), *self.workers]

    def first_exit(self) -> ChildProcess | None:
        return next((c for c in self.children() if c.process.poll() is not None), None)

    def stop(self) -> None:
        # Scheduler first, so that it never sees its workers vanish mid-step.
        for child in self.children():
            child.stop(timeout_s=self.grace_period_s + STOP_TIMEOUT_S)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
