"""The core's API processes: started with the core's own flags, watched, stopped.

Each child is `python -m scheduler_svc.split.api_process` with the argv the core was
given (the same keys, TLS, ports, limits), the gRPC port made concrete (a port of 0
would give each child its own), the core's socket and its index in the environment,
and PROMETHEUS_MULTIPROC_DIR so its request metrics land where the core's registry
reads them. CBSERVE_DIE_WITH_PARENT makes it stop when the core dies, however.

A child that exits while the core serves takes its clients' streams with it; the core
then stops as a whole (exit code 1) rather than serve on with part of its doors gone,
so that its supervisor (Kubernetes, compose, systemd) restarts it, as vLLM does when
an API server dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import structlog

from common import parent_watch

log = structlog.get_logger("scheduler.supervisor")

# After SIGTERM, how long past their grace period the children get before SIGKILL.
STOP_SLACK_S = 10.0


class ApiProcesses:
    def __init__(self, argv: list[str], count: int, socket_path: str, metrics_dir: str) -> None:
        self._argv = argv
        self._count = count
        self._env = {
            **os.environ,
            "CBSERVE_CORE_SOCKET": socket_path,
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
            parent_watch.ENV_VAR: str(os.getpid()),
        }
        self.processes: list[asyncio.subprocess.Process] = []
        self._stopping = False

    async def start(self) -> None:
        for index in range(self._count):
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "scheduler_svc.split.api_process",
                *self._argv,
                env={**self._env, "CBSERVE_API_INDEX": str(index)},
            )
            self.processes.append(process)

    async def first_exit(self) -> tuple[int, int]:
        """Waits until one child exits; returns its (index, exit code)."""
        waits = {
            asyncio.create_task(process.wait()): index
            for index, process in enumerate(self.processes)
        }
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        task = next(iter(done))
        return waits[task], task.result()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM (each drains its streams for grace_s), then SIGKILL what is left."""
        self._stopping = True
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        waits = [process.wait() for process in self.processes]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), grace_s + STOP_SLACK_S)
        except asyncio.TimeoutError:
            for index, process in enumerate(self.processes):
                if process.returncode is None:
                    log.warning("API process did not stop; killing it", api_process=index)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(process.wait() for process in self.processes))
