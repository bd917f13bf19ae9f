"""Both processes print one ready line, or exit non-zero with a clear message."""

from __future__ import annotations

import socket
import subprocess
import sys

from cbserve.local_stack import free_port


def _run(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )


def test_scheduler_exits_when_worker_unreachable():
    port = free_port()
    result = _run(
        "scheduler_svc",
        "--port",
        str(free_port()),
        "--worker",
        f"127.0.0.1:{port}",
        "--worker-connect-timeout",
        "2",
    )
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr and "unreachable" in result.stderr


def test_scheduler_exits_when_port_taken(stack):
    host, port = stack.address.rsplit(":", 1)
    result = _run("scheduler_svc", "--host", host, "--port", port, "--worker", "127.0.0.1:1")
    assert result.returncode != 0
    assert "cannot listen" in result.stderr


def test_scheduler_exits_on_bad_config():
    result = _run("scheduler_svc", "--worker", "127.0.0.1:1", "--max-num-seqs", "0")
    assert result.returncode != 0
    assert "max_num_seqs" in result.stderr


def test_worker_exits_when_model_missing(tmp_path):
    result = _run("worker_svc", "--port", str(free_port()), "--model", str(tmp_path / "nothing"))
    assert result.returncode != 0
    assert "nothing" in result.stderr


def test_worker_exits_when_port_taken():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _run(
            "worker_svc", "--host", "127.0.0.1", "--port", str(port), "--num-kv-blocks", "16"
        )
    assert result.returncode != 0
    assert str(port) in result.stderr


def test_cli_generate_streams_answer(stack):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cbserve.cli",
            "generate",
            "--server",
            stack.address,
            "--chat",
            "What is the capital of France?",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--usage",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "[STOP]" in result.stderr
