"""docker-compose.yml runs the real command lines: a renamed flag fails here, not in a cluster.

No Docker engine is needed: the file is parsed as YAML and each service's command
is handed to the argument parser of the process it starts.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scheduler_svc.__main__ import parse_args as parse_scheduler_args

COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
REPO_ROOT = COMPOSE_FILE.parent


def _services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def _command(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def _services_running(module: str) -> dict[str, list[str]]:
    """Service name -> the arguments after `python -m <module>`, for services that run it."""
    found = {}
    for name, service in _services().items():
        argv = _command(service)
        if argv[:3] == ["python", "-m", module]:
            found[name] = argv[3:]
    return found


def _flags(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def _option_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_compose_has_a_scheduler_and_two_workers():
    services = _services()
    assert {"scheduler", "worker-0", "worker-1"} <= set(services)
    assert set(_services_running("scheduler_svc")) == {"scheduler"}
    assert set(_services_running("worker_svc")) == {"worker-0", "worker-1"}


def test_scheduler_command_is_accepted_by_its_parser():
    (args,) = _services_running("scheduler_svc").values()
    try:
        parsed = parse_scheduler_args(args)
    except SystemExit as exit_:
        pytest.fail(f"python -m scheduler_svc rejects the compose command {args}: exit {exit_}")
    assert parsed.host == "0.0.0.0"
    assert parsed.worker == ["worker-0:50061", "worker-1:50061"]


def test_scheduler_reaches_every_worker_and_is_published():
    services = _services()
    workers = _services_running("worker_svc")
    scheduler_args = _services_running("scheduler_svc")["scheduler"]
    parsed = parse_scheduler_args(scheduler_args)
    expected = {f"{name}:{_option_value(args, '--port')}" for name, args in workers.items()}
    assert set(parsed.worker) == expected
    assert set(services["scheduler"]["depends_on"]) >= set(workers)
    published = [str(port) for port in services["scheduler"]["ports"]]
    assert f"{parsed.port}:{parsed.port}" in published


def _help_flags(module: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"python -m {module} --help failed:\n{result.stderr}"
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", result.stdout))


@pytest.mark.parametrize("module", ["scheduler_svc", "worker_svc"])
def test_every_flag_is_spelled_out_in_help(module):
    # argparse accepts a prefix of a longer flag, so parsing alone would not notice
    # `--port` being renamed `--port-number`; the exact names must be listed.
    known = _help_flags(module)
    for name, args in _services_running(module).items():
        unknown = _flags(args) - known
        assert not unknown, f"{name} passes flags that python -m {module} lacks: {unknown}"


def test_worker_command_is_accepted_by_its_parser():
    import worker_svc.__main__ as worker_main

    if hasattr(worker_main, "build_parser"):
        parse = worker_main.build_parser().parse_args
    elif hasattr(worker_main, "parse_args"):
        parse = worker_main.parse_args
    else:
        pytest.skip("worker_svc.__main__ exposes no parser; its --help is checked instead")
    for name, args in _services_running("worker_svc").items():
        try:
            parsed = parse(args)
        except SystemExit as exit_:
            pytest.fail(f"python -m worker_svc rejects {name}'s command {args}: exit {exit_}")
        assert parsed.host == "0.0.0.0"
        assert parsed.port == 50061
