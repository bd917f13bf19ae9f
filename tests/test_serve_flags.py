"""`cbserve serve` passes its flags on to the processes it starts, checked without
starting them: the command lines the stack would run are handed to the scheduler's and
the worker's own parsers. One end-to-end run checks what it prints at start."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
import urllib.request

import pytest

from cbserve.launch import add_serve_arguments, announce, stack_from_args
from cbserve.local_stack import ChildProcess, LocalStack, free_port
from common.cli_config import FlagError
from common.defaults import DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT, REPO_ROOT
from scheduler_svc.flags import edge_config_from_args
from scheduler_svc.flags import parse_args as parse_scheduler_args
from tests.waiting import wait_until
from worker_svc.__main__ import build_parser as worker_parser


@pytest.fixture(autouse=True)
def _no_stack_variables(monkeypatch):
    # The variables a developer may have set would change what is passed on.
    for name in ("CBSERVE_API_KEY", "CBSERVE_SCHEDULER_API_KEY", "CBSERVE_SERVE_HTTP_PORT"):
        monkeypatch.delenv(name, raising=False)


def _stack(argv: list[str]) -> LocalStack:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return stack_from_args(parser.parse_args(argv))


def _scheduler(stack: LocalStack, monkeypatch) -> argparse.Namespace:
    """What the scheduler process would parse: its argv after `-m scheduler_svc`, with
    the variables the stack gives it."""
    for name, value in stack.scheduler_env.items():
        monkeypatch.setenv(name, value)
    return parse_scheduler_args(stack.scheduler_argv()[3:])


def _worker(stack: LocalStack) -> argparse.Namespace:
    return worker_parser().parse_args(stack.worker_argv(0)[3:])


def test_serve_turns_on_http_on_8000_and_metrics_on_a_fixed_port(monkeypatch):
    stack = _stack([])
    scheduler = _scheduler(stack, monkeypatch)
    assert scheduler.http_port == DEFAULT_HTTP_PORT == 8000
    assert scheduler.metrics_port == DEFAULT_METRICS_PORT
    assert stack.http_url == "http://127.0.0.1:8000"
    assert (scheduler.log_level, _worker(stack).log_level) == ("info", "info")


def test_port_0_turns_http_and_metrics_off(monkeypatch):
    stack = _stack(["--http-port", "0", "--metrics-port", "0"])
    assert "--http-port" not in stack.scheduler_argv()
    scheduler = _scheduler(stack, monkeypatch)
    assert (scheduler.http_port, scheduler.metrics_port) == (0, 0)
    assert stack.http_url is None and stack.metrics_url is None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        announce(stack)
    assert "metrics:" not in printed.getvalue() and "HTTP API" not in printed.getvalue()


def test_metrics_port_minus_1_is_still_off_with_a_warning(monkeypatch):
    with pytest.warns(FutureWarning, match="0 turns it off"):
        stack = _stack(["--metrics-port", "-1"])
    assert stack.metrics_url is None


def test_a_bare_local_stack_keeps_http_off_and_8000_free():
    # Tests start stacks side by side: none may take the fixed port unless asked.
    assert LocalStack().http_port is None
    assert "--http-port" not in LocalStack().scheduler_argv()
    asked = LocalStack(http_port=0)
    assert asked.http_port not in (None, 0, DEFAULT_HTTP_PORT)
    assert "--http-port" in asked.scheduler_argv()


def test_api_keys_reach_the_scheduler_by_variable_not_by_command_line(monkeypatch):
    stack = _stack(["--api-key", "key-one", "--api-key", "key-two"])
    assert not any("key-" in arg for arg in stack.scheduler_argv() + stack.worker_argv(0))
    scheduler = _scheduler(stack, monkeypatch)
    assert edge_config_from_args(scheduler).api_key == ["key-one", "key-two"]


def test_cbserve_api_key_variable_is_read_by_serve(monkeypatch):
    monkeypatch.setenv("CBSERVE_API_KEY", "from-env")
    stack = _stack([])
    assert stack.scheduler_env == {"CBSERVE_SCHEDULER_API_KEY": "from-env"}
    # The command line wins over the variable.
    assert _stack(["--api-key", "flag"]).scheduler_env == {"CBSERVE_SCHEDULER_API_KEY": "flag"}


def test_tls_flags_are_passed_on_and_checked_before_starting(monkeypatch):
    stack = _stack(["--tls-cert", "server.pem", "--tls-key", "server.key"])
    edge = edge_config_from_args(_scheduler(stack, monkeypatch))
    assert (edge.tls_cert, edge.tls_key) == ("server.pem", "server.key")
    assert stack.http_url.startswith("https://")
    with pytest.raises(FlagError, match="--tls-cert"):
        _stack(["--tls-cert", "server.pem"])


def test_worker_flags_and_log_level_reach_every_process(monkeypatch):
    argv = ["--threads", "2", "--device", "cpu", "--attention-backend", "torch"]
    stack = _stack([*argv, "--log-level", "debug", "--num-workers", "2"])
    for index in range(2):
        worker = worker_parser().parse_args(stack.worker_argv(index)[3:])
        assert (worker.threads, worker.device, worker.attention_backend) == (2, "cpu", "torch")
        assert worker.log_level == "debug"
    assert _scheduler(stack, monkeypatch).log_level == "debug"


def test_num_prefill_workers_makes_the_last_workers_prefill_workers(monkeypatch):
    stack = _stack(["--num-workers", "3", "--num-prefill-workers", "1", "--worker-port", "7100"])
    scheduler = _scheduler(stack, monkeypatch)
    assert scheduler.worker == ["127.0.0.1:7100", "127.0.0.1:7101"]
    assert scheduler.prefill_worker == ["127.0.0.1:7102"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--http-port", "70000"],
        ["--metrics-port", "-2"],
        ["--log-level", "verbose"],
        ["--num-workers", "2", "--num-prefill-workers", "2"],
    ],
)
def test_bad_values_are_refused_before_any_process_starts(argv):
    with pytest.raises((FlagError, SystemExit)):
        _stack(argv)


@pytest.mark.process
def test_version_prints_the_package_version():
    result = subprocess.run(
        [sys.executable, "-m", "cbserve.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"cbserve {declared}"


@pytest.mark.process
@pytest.mark.model
def test_serve_prints_where_grpc_http_and_metrics_listen():
    ports = {name: free_port() for name in ("port", "worker-port", "http-port", "metrics-port")}
    argv = [sys.executable, "-m", "cbserve.launch"]
    for name, port in ports.items():
        argv += [f"--{name}", str(port)]
    serve = ChildProcess("cbserve serve", argv)
    try:
        lines = _lines_until(serve, "Ctrl-C stops everything")
        assert f"cbserve is serving on 127.0.0.1:{ports['port']} (gRPC)" in lines
        assert f"OpenAI-compatible HTTP API: http://127.0.0.1:{ports['http-port']}/v1" in lines
        metrics_url = f"http://127.0.0.1:{ports['metrics-port']}/metrics"
        assert f"metrics: {metrics_url}" in lines
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            assert response.status == 200
        # The printed HTTP address is the front's: healthy once the worker is connected.
        health_url = f"http://127.0.0.1:{ports['http-port']}/health"
        with urllib.request.urlopen(health_url, timeout=10) as response:
            assert response.status == 200
    finally:
        assert serve.stop() == 0


def _lines_until(child: ChildProcess, marker: str, timeout_s: float = 240.0) -> str:
    def printed() -> bool:
        assert child.process.poll() is None, "\n".join(child.lines)
        return any(marker in line for line in child.lines)

    wait_until(lambda: "\n".join(child.lines) or "nothing printed", printed, timeout_s, 0.2)
    return "\n".join(child.lines)


def test_the_start_message_says_keys_are_on_without_printing_them(capsys):
    # A key must not end up in a terminal's scrollback or a log file.
    announce(_stack(["--api-key", "secret-key", "--host", "0.0.0.0"]))
    printed = capsys.readouterr().out
    assert "Authorization: Bearer KEY" in printed
    assert "secret-key" not in printed
    assert "http://localhost:8000/v1" in printed


def test_lora_flags_reach_the_scheduler_and_every_worker(monkeypatch):
    # vLLM's flags, each taken once: a scheduler with adapters uses only workers
    # started for them, with the same limits.
    limits = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--max-cpu-loras", "3"]
    modules = ["--lora-modules", "sql=/adapters/sql", '{"name": "chat", "path": "/adapters/chat"}']
    stack = _stack([*limits, *modules, "--num-workers", "2"])
    scheduler = _scheduler(stack, monkeypatch)
    assert scheduler.enable_lora
    assert (scheduler.max_loras, scheduler.max_lora_rank, scheduler.max_cpu_loras) == (2, 8, 3)
    assert scheduler.lora_modules == [modules[1], modules[2]]
    for index in range(2):
        worker = worker_parser().parse_args(stack.worker_argv(index)[3:])
        assert worker.enable_lora
        assert (worker.max_loras, worker.max_lora_rank, worker.max_cpu_loras) == (2, 8, 3)
        # The adapters' paths are the scheduler's: it sends them to a worker when needed.
        assert "--lora-modules" not in stack.worker_argv(index)


def test_lora_stays_off_unless_asked_and_bad_limits_fail_before_start(monkeypatch):
    stack = _stack([])
    assert not any("lora" in arg for arg in stack.scheduler_argv() + stack.worker_argv(0))
    assert not _scheduler(stack, monkeypatch).enable_lora
    with pytest.raises(FlagError, match="max-cpu-loras|max_cpu_loras"):
        _stack(["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"])
    with pytest.raises(FlagError, match="enable"):
        _stack(["--lora-modules", "sql=/adapters/sql"])
