"""Real processes on loopback: cbserve replicas and SGLang's model gateway in front.

A replica is what `cbserve serve` starts: one scheduler (HTTP front on) with its own
null worker (`--model-impl null`: no model, but the scheduler's block tables and prefix
cache are the real ones, so cached prompt tokens are what a real worker would reuse).
The router is the `sglang-router` package from PyPI (its Rust gateway, started as
`python -m sglang_router.launch_router`), told every replica's HTTP front.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cbserve.local_stack import ChildProcess, LocalStack, free_port

ROUTER_MODULE = "sglang_router.launch_router"
ROUTER_READY_TIMEOUT_S = 60.0


def router_missing() -> str | None:
    """Why the router cannot run here, or None when its package is installed."""
    if importlib.util.find_spec("sglang_router") is None:
        return "the sglang-router package is not installed (pip install sglang-router==0.3.2)"
    return None


def start_replica(null_step_ms: float, num_kv_blocks: int, log_path=None) -> LocalStack:
    stack = LocalStack(
        num_workers=1,
        http_port=0,
        worker_args=[
            "--model-impl",
            "null",
            "--null-step-ms",
            f"{null_step_ms:g}",
            "--num-kv-blocks",
            str(num_kv_blocks),
        ],  # fmt: skip
        scheduler_log=log_path,
    )
    return stack.start()


def start_replicas(count: int, null_step_ms: float, num_kv_blocks: int, log_path=None):
    """count replicas started side by side (each start mostly waits on its children's
    imports); all stopped again if any fails."""
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start_replica, null_step_ms, num_kv_blocks, log_path)
                   for _ in range(count)]  # fmt: skip
    started, failure = [], None
    for future in futures:
        try:
            started.append(future.result())
        except Exception as error:  # noqa: BLE001 - stopped below, then raised
            failure = failure or error
    if failure is not None:
        for stack in started:
            stack.stop()
        raise failure
    return started


def kill_replica(stack: LocalStack) -> None:
    """SIGKILL the replica's scheduler (its HTTP front dies with it, mid-request), then
    stop its worker: what a node or a pod lost without warning looks like to a router."""
    stack.scheduler.stop(sig=signal.SIGKILL, timeout_s=5.0)
    for worker in stack.workers:
        worker.stop(sig=signal.SIGKILL, timeout_s=5.0)


@dataclass
class Router:
    """One sglang-router process over the given worker URLs."""

    worker_urls: list[str]
    policy: str
    # A retry goes to another worker the policy picks; the circuit breaker takes a worker
    # that keeps failing out of the choice until a health check passes again.
    retry_max_retries: int = 5
    health_check_interval_s: int = 1
    cb_failure_threshold: int = 2
    log_path: str | None = None
    port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    process: ChildProcess | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", ROUTER_MODULE, "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--policy", self.policy]
        argv += ["--worker-urls", *self.worker_urls]
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus_port)]
        argv += ["--retry-max-retries", str(self.retry_max_retries)]
        argv += ["--retry-initial-backoff-ms", "50", "--retry-max-backoff-ms", "1000"]
        argv += ["--health-check-interval-secs", str(self.health_check_interval_s)]
        argv += ["--health-failure-threshold", "1"]
        argv += ["--cb-failure-threshold", str(self.cb_failure_threshold)]
        argv += ["--cb-timeout-duration-secs", "5"]
        # Prefix matching decides, whatever the load: the workload is balanced by itself.
        argv += ["--cache-threshold", "0.3", "--log-level", "warn"]
        return argv

    def start(self) -> Router:
        self.process = ChildProcess(f"router-{self.policy}", self.argv(), stderr_path=self.log_path)
        deadline = time.monotonic() + ROUTER_READY_TIMEOUT_S
        while not self._all_workers_registered():
            if self.process.process.poll() is not None:
                raise RuntimeError(f"the router exited with {self.process.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the router did not register its workers in {deadline}s")
            time.sleep(0.2)
        return self

    def _all_workers_registered(self) -> bool:
        # Workers register in the background after the port opens; /v1/models answers
        # once one has, /workers lists them all.
        try:
            with urllib.request.urlopen(self.url + "/workers", timeout=2.0) as response:
                body = response.read().decode()
        except (urllib.error.URLError, OSError):
            return False
        return all(url in body for url in self.worker_urls)

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.prometheus_port}/metrics"
        with urllib.request.urlopen(url, timeout=5.0) as response:
            return response.read().decode()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=5.0)

    def __enter__(self) -> Router:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
