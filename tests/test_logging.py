"""Logs: one JSON object per line when stderr is not a terminal, readable lines on one.

Each case runs configure_logging in a child process, so this process's own
logging set-up is untouched; a pseudo-terminal stands in for a person's terminal.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.process

PROGRAM = """
import logging
import structlog
from structlog.contextvars import bound_contextvars
from common.logging import configure_logging

configure_logging("info")
log = structlog.get_logger("test")
with bound_contextvars(request_id="abc123"):
    log.info("request finished", output_tokens=7)
    logging.getLogger("grpc").warning("from the standard library")
log.debug("hidden at info")
log.info("no request here")
"""


def _run(stderr) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=60,
    )


def test_json_lines_when_stderr_is_not_a_terminal():
    result = _run(subprocess.PIPE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # stdout is for the ready line only
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [line["event"] for line in lines] == [
        "request finished",
        "from the standard library",
        "no request here",
    ]
    finished, stdlib, after = lines
    assert finished["request_id"] == "abc123" and finished["output_tokens"] == 7
    assert finished["level"] == "info" and finished["timestamp"].endswith("Z")
    # Bound values reach the standard library's lines too, and end with their block.
    assert stdlib["request_id"] == "abc123" and stdlib["level"] == "warning"
    assert "request_id" not in after


def test_readable_lines_on_a_terminal():
    leader, follower = pty.openpty()
    try:
        result = _run(follower)
        os.close(follower)
        follower = -1
        output = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child side is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert result.returncode == 0
    text = output.decode()
    assert "request finished" in text and "request_id" in text and "abc123" in text
    assert not any(line.lstrip().startswith("{") for line in text.splitlines())
