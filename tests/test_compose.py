"""docker-compose runs the real command lines: a renamed flag fails here, not on a host.

No Docker engine is needed: each variant (the CPU file alone, and the CPU file with the
GPU override) is merged the way compose merges an override for the keys checked here,
and each service's command is handed to the argument parser of the process it starts.
The health checks are checked the same way against common.health_probe's parser.
When Debian's docker-compose is installed, it also renders both variants (CI installs
it; `make compose-config` is the same check).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.health_probe import build_parser as health_probe_parser
from scheduler_svc.flags import edge_config_from_args
from scheduler_svc.flags import parse_args as parse_scheduler_args
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "cpu": ["docker-compose.yml"],
    "gpu": ["docker-compose.yml", "docker-compose.gpu.yml"],
}
# Upstream flash-attn's paged KV rule (worker_svc/attention/flash_backend.py).
FLASH_ATTN_BLOCK_MULTIPLE = 256


def _merge(base: dict, override: dict) -> dict:
    """Compose's override rule for the keys these tests read: mappings merge key by
    key, anything else (command, healthcheck.test, device lists) is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _services(variant: str) -> dict[str, dict]:
    services: dict[str, dict] = {}
    for name in VARIANTS[variant]:
        services = _merge(services, yaml.safe_load((REPO_ROOT / name).read_text())["services"])
    return services


def _command(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def _services_running(variant: str, module: str) -> dict[str, list[str]]:
    """Service name -> the arguments after `python -m <module>`, for services that run it."""
    found = {}
    for name, service in _services(variant).items():
        argv = _command(service)
        if argv[:3] == ["python", "-m", module]:
            found[name] = argv[3:]
    return found


def _flags(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def _option_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _parse_scheduler(args: list[str]):
    try:
        return parse_scheduler_args(args)
    except SystemExit as exit_:
        pytest.fail(f"python -m scheduler_svc rejects the compose command {args}: exit {exit_}")


def _parse_worker(name: str, args: list[str]):
    try:
        return worker_parser().parse_args(args)
    except SystemExit as exit_:
        pytest.fail(f"python -m worker_svc rejects {name}'s command {args}: exit {exit_}")


variants = pytest.mark.parametrize("variant", sorted(VARIANTS))


@variants
def test_compose_has_a_scheduler_and_two_workers(variant):
    services = _services(variant)
    assert {"scheduler", "worker-0", "worker-1"} <= set(services)
    assert set(_services_running(variant, "scheduler_svc")) == {"scheduler"}
    assert set(_services_running(variant, "worker_svc")) == {"worker-0", "worker-1"}


def test_gpu_override_adds_no_service():
    # A service only in the override would run without the base's health check.
    base = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    gpu = yaml.safe_load((REPO_ROOT / "docker-compose.gpu.yml").read_text())["services"]
    assert set(gpu) <= set(base)


@variants
def test_scheduler_command_is_accepted_by_its_parser(variant):
    (args,) = _services_running(variant, "scheduler_svc").values()
    parsed = _parse_scheduler(args)
    assert parsed.host == "0.0.0.0"
    assert parsed.worker == ["worker-0:50061", "worker-1:50061"]


@variants
def test_scheduler_reaches_every_worker_and_is_published(variant):
    services = _services(variant)
    workers = _services_running(variant, "worker_svc")
    parsed = _parse_scheduler(_services_running(variant, "scheduler_svc")["scheduler"])
    expected = {f"{name}:{_option_value(args, '--port')}" for name, args in workers.items()}
    assert set(parsed.worker) == expected
    published = [str(port) for port in services["scheduler"]["ports"]]
    assert f"{parsed.port}:{parsed.port}" in published
    assert f"{parsed.metrics_port}:{parsed.metrics_port}" in published


@variants
def test_scheduler_serves_the_http_api_on_a_published_8000(variant):
    services = _services(variant)
    parsed = _parse_scheduler(_services_running(variant, "scheduler_svc")["scheduler"])
    assert parsed.http_port == 8000
    assert "8000:8000" in [str(port) for port in services["scheduler"]["ports"]]


@variants
def test_the_api_key_comes_from_the_environment_and_may_be_absent(variant, monkeypatch):
    environment = _services(variant)["scheduler"]["environment"]
    # `${VAR:-}`: compose substitutes an empty value when the shell has none, and an
    # empty variable counts as unset (common.cli_config): no key is asked for.
    assert environment["CBSERVE_API_KEY"] == "${CBSERVE_API_KEY:-}"
    args = _services_running(variant, "scheduler_svc")["scheduler"]
    monkeypatch.delenv("CBSERVE_SCHEDULER_API_KEY", raising=False)
    monkeypatch.setenv("CBSERVE_API_KEY", "")
    assert edge_config_from_args(_parse_scheduler(args)).api_key == []
    monkeypatch.setenv("CBSERVE_API_KEY", "k1,k2")
    assert edge_config_from_args(_parse_scheduler(args)).api_key == ["k1", "k2"]
    for workers in _services_running(variant, "worker_svc"):
        assert "CBSERVE_API_KEY" not in _services(variant)[workers].get("environment", {})


@variants
def test_scheduler_starts_beside_its_workers(variant):
    # The scheduler waits for loading workers itself (tests/integration/test_start_order.py):
    # compose only orders the containers' start, never the model loads.
    services = _services(variant)
    depends_on = services["scheduler"]["depends_on"]
    for worker in _services_running(variant, "worker_svc"):
        assert depends_on[worker] == {"condition": "service_started"}, worker


@variants
def test_every_health_check_asks_its_own_service_port(variant):
    for name, service in _services(variant).items():
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", f"{name}: a shell form would hide the probe's exit code"
        assert test[1:4] == ["python", "-m", "common.health_probe"], name
        probe = health_probe_parser().parse_args(test[4:])
        host, port = probe.address.rsplit(":", 1)
        assert host == "localhost", name
        assert port == _option_value(_command(service), "--port"), name


@variants
def test_worker_commands_make_a_valid_worker_config(variant):
    for name, args in _services_running(variant, "worker_svc").items():
        parsed = _parse_worker(name, args)
        assert (parsed.host, parsed.port) == ("0.0.0.0", 50061)
        # The same validation the worker runs before loading anything.
        config_from_args(parsed, model="unused")


@variants
def test_workers_serve_metrics_on_an_exposed_port(variant):
    services = _services(variant)
    for name, args in _services_running(variant, "worker_svc").items():
        parsed = _parse_worker(name, args)
        assert parsed.metrics_port > 0, f"{name}: no --metrics-port"
        assert str(parsed.metrics_port) in [str(port) for port in services[name]["expose"]], name


def test_cpu_workers_do_not_spin_against_each_other():
    for name, args in _services_running("cpu", "worker_svc").items():
        parsed = _parse_worker(name, args)
        environment = _services("cpu")[name].get("environment", {})
        assert parsed.threads == 1 or environment.get("OMP_WAIT_POLICY") == "PASSIVE", name
        assert parsed.device in ("auto", "cpu"), name


def test_gpu_workers_run_bf16_flash_attention_on_a_reserved_gpu():
    services = _services("gpu")
    gpu_ids = []
    for name, args in _services_running("gpu", "worker_svc").items():
        parsed = _parse_worker(name, args)
        assert parsed.device.startswith("cuda"), name
        assert parsed.dtype == "bfloat16", name
        assert parsed.attention_backend == "flash_attn", name
        assert parsed.block_size % FLASH_ATTN_BLOCK_MULTIPLE == 0, (
            f"{name}: flash-attn's paged KV needs a block size divisible by 256"
        )
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        gpu_ids += device["device_ids"]
        assert services[name]["build"]["args"]["FLASH_ATTN"] == "1", name
    assert len(set(gpu_ids)) == len(gpu_ids), "by default each worker has a GPU of its own"


def test_one_image_per_variant():
    for variant in VARIANTS:
        images = {service["image"] for service in _services(variant).values()}
        assert len(images) == 1, f"{variant}: {images}"


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


@pytest.mark.process
@pytest.mark.parametrize("module", ["scheduler_svc", "worker_svc"])
def test_every_flag_is_spelled_out_in_help(module):
    # argparse accepts a prefix of a longer flag, so parsing alone would not notice
    # `--port` being renamed `--port-number`; the exact names must be listed.
    known = _help_flags(module)
    for variant in VARIANTS:
        for name, args in _services_running(variant, module).items():
            unknown = _flags(args) - known
            assert not unknown, f"{variant} {name} passes flags python -m {module} lacks: {unknown}"


@pytest.mark.process
@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@variants
def test_docker_compose_renders_the_variant(variant):
    files = [arg for name in VARIANTS[variant] for arg in ("-f", name)]
    result = subprocess.run(
        ["docker-compose", *files, "config", "--quiet"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
