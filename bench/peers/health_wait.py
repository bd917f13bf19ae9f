"""Waiting for a peer server (llama-server, vLLM) to serve: both answer GET /health with
200 once the model is loaded (503 or no answer before), and a peer that exits or never
gets there must fail the run with its own log's last lines, not hang it."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(
    name: str,
    process: subprocess.Popen,
    url: str,
    timeout_s: float,
    log_tail: Callable[[], str],
    stop: Callable[[], None],
    poll_s: float = 0.2,
) -> None:
    """Returns once `url`/health answers 200; raises RuntimeError when the process
    exits first, TimeoutError (after `stop()`) when `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        code = process.poll()
        if code is not None:
            raise RuntimeError(f"{name} exited with {code} at start{log_tail()}")
        if time.monotonic() > deadline:
            stop()
            raise TimeoutError(f"{name} not healthy after {timeout_s:.0f} s{log_tail()}")
        time.sleep(poll_s)
