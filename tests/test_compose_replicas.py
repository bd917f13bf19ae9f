"""docker-compose.replicas.yml runs the real command lines: three cbserve replicas (each a
scheduler with its own worker) behind SGLang's model gateway.

As tests/test_compose.py does for docker-compose.yml: no Docker engine, every command
handed to the argument parser of the process it starts, the router's to sglang-router's
own parser (the dev extra installs it), and docker-compose renders the file where it is
installed (CI installs it; `make compose-config`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.health_probe import build_parser as health_probe_parser
from scheduler_svc.flags import parse_args as parse_scheduler_args
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.replicas.yml"
ROUTER_MODULE = ["python", "-m", "sglang_router.launch_router"]


def _services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def _command(service: dict) -> list[str]:
    return [str(arg) for arg in service["command"]]


def _running(module: str) -> dict[str, list[str]]:
    return {name: _command(s)[3:] for name, s in _services().items()
            if _command(s)[:3] == ["python", "-m", module]}  # fmt: skip


def _router_args():
    parse_router_args = pytest.importorskip("sglang_router.launch_router").parse_router_args
    (args,) = _running("sglang_router.launch_router").values()
    try:
        return parse_router_args(args)
    except SystemExit as exit_:
        pytest.fail(f"sglang-router rejects {args}: exit {exit_}")


def test_three_replicas_each_a_scheduler_with_its_own_worker():
    schedulers = _running("scheduler_svc")
    workers = _running("worker_svc")
    assert len(schedulers) == len(workers) == 3
    dialled = []
    for name, args in schedulers.items():
        parsed = parse_scheduler_args(args)
        (worker,) = parsed.worker
        host, port = worker.rsplit(":", 1)
        assert host in workers, f"{name} dials {host}, which is no worker service"
        assert port == str(worker_parser().parse_args(workers[host]).port)
        assert _services()[name]["depends_on"][host] == {"condition": "service_started"}
        dialled.append(host)
    # A worker resets itself when a Step stream opens: never two schedulers on one.
    assert sorted(dialled) == sorted(workers)


def test_worker_commands_make_a_valid_worker_config():
    for name, args in _running("worker_svc").items():
        parsed = worker_parser().parse_args(args)
        config_from_args(parsed, model="unused")
        assert parsed.threads == 1, f"{name}: three workers share the host's cores"


def test_the_router_reaches_every_replicas_http_front():
    router = _router_args()
    expected = set()
    for name, args in _running("scheduler_svc").items():
        expected.add(f"http://{name}:{parse_scheduler_args(args).http_port}")
        assert str(parse_scheduler_args(args).http_port) in _services()[name]["expose"]
    assert set(router.worker_urls) == expected
    assert router.policy == "cache_aware"
    assert router.retry_max_retries >= 2 and not router.disable_retries
    assert router.health_check_endpoint == "/health"  # the scheduler's HTTP front serves it


def test_only_the_router_is_published():
    router = _router_args()
    services = _services()
    published = {name for name, service in services.items() if service.get("ports")}
    (name,) = published
    assert f"{router.port}:{router.port}" in services[name]["ports"]
    assert f"{router.prometheus_port}:{router.prometheus_port}" in services[name]["ports"]
    for scheduler in _running("scheduler_svc"):
        assert services[name]["depends_on"][scheduler] == {"condition": "service_healthy"}


def test_the_router_image_installs_the_version_tested_here():
    dockerfile = REPO_ROOT / _services()["router"]["build"]["context"] / "router.Dockerfile"
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    pins = [
        line.strip() for line in dockerfile.read_text().splitlines() if "sglang-router==" in line
    ]
    (pin,) = pins
    version = pin.split("sglang-router==")[1].split()[0]
    assert f'"sglang-router=={version}"' in pyproject
    assert _command(_services()["router"])[:3] == ROUTER_MODULE


def test_every_cbserve_health_check_asks_its_own_port():
    for name, service in _services().items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if name == "router":
            continue
        probe = health_probe_parser().parse_args(test[4:])
        assert (
            probe.address == f"localhost:{_command(service)[_command(service).index('--port') + 1]}"
        )


@pytest.mark.process
@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_renders_the_file():
    result = subprocess.run(
        ["docker-compose", "-f", COMPOSE_FILE.name, "config", "--quiet"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
