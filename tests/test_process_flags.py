"""The four command lines built from the configs: every flag has its variable, the
variables reach the processes, and `cbserve serve` passes the stack's flags on."""

from __future__ import annotations

import argparse

import pytest

from bench.serving import options
from cbserve.launch import ServeConfig, add_serve_arguments, stack_from_args
from common.addresses import port_or_off
from common.cli_config import build, to_argv
from common.flag_fields import SERVE, flags_of, forwarded_flags
from scheduler_svc.config import SCHEDULER_CONFIGS, SchedulerConfig
from scheduler_svc.flags import build_parser as scheduler_parser
from scheduler_svc.flags import configs_from_args, edge_config_from_args, parse_args
from worker_svc.__main__ import build_parser as worker_parser
from worker_svc.__main__ import config_from_args
from worker_svc.config import WorkerConfig


def _with(add) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser


PARSERS = {
    "scheduler": scheduler_parser,
    "worker": worker_parser,
    "serve": lambda: _with(add_serve_arguments),
    "bench": lambda: _with(options.add_arguments),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_flag_names_its_variable(name):
    parser = PARSERS[name]()
    flags = [action for action in parser._actions if action.dest != "help"]
    assert flags
    for action in flags:
        assert " env CBSERVE_" in action.help, action.option_strings


def test_scheduler_variables_fill_its_configs(monkeypatch):
    monkeypatch.setenv("CBSERVE_SCHEDULER_WORKER", "w0:1,w1:2")
    monkeypatch.setenv("CBSERVE_SCHEDULER_MAX_NUM_SEQS", "8")
    monkeypatch.setenv("CBSERVE_SCHEDULER_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("CBSERVE_SCHEDULER_GRACE_PERIOD", "3")
    process, config, faults = configs_from_args(parse_args([]))
    assert process.worker == ["w0:1", "w1:2"]
    assert (config.max_num_seqs, config.enable_prefix_caching) == (8, False)
    assert faults.grace_period_s == 3.0
    # The command line still wins.
    _, config, _ = configs_from_args(parse_args(["--max-num-seqs", "16"]))
    assert config.max_num_seqs == 16


def test_a_bad_scheduler_variable_stops_the_parse_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("CBSERVE_SCHEDULER_MAX_NUM_BATCHED_TOKENS", "0")
    with pytest.raises(SystemExit):
        parse_args(["--worker", "w:1"])
    error = capsys.readouterr().err
    assert "--max-num-batched-tokens (env CBSERVE_SCHEDULER_MAX_NUM_BATCHED_TOKENS)" in error


def test_the_worker_reads_its_variables_and_cbserve_dtype(monkeypatch):
    monkeypatch.setenv("CBSERVE_DTYPE", "int8")
    monkeypatch.setenv("CBSERVE_WORKER_KV_CACHE_MEMORY", "1GiB")
    config = config_from_args(worker_parser().parse_args([]), model="m")
    assert (config.dtype, config.kv_cache_memory) == ("int8", 1 << 30)
    monkeypatch.setenv("CBSERVE_WORKER_DTYPE", "float32")
    assert config_from_args(worker_parser().parse_args([]), model="m").dtype == "float32"


WORKER_FLAGS = forwarded_flags(WorkerConfig, SERVE)
SCHEDULER_FLAGS = forwarded_flags(SchedulerConfig, SERVE)


def test_serve_passes_on_only_the_stack_flags_given(monkeypatch):
    monkeypatch.delenv("CBSERVE_DTYPE", raising=False)
    args = PARSERS["serve"]().parse_args([])
    assert to_argv(args, WorkerConfig, WORKER_FLAGS) == []
    assert to_argv(args, SchedulerConfig, SCHEDULER_FLAGS) == []
    # Variables are read when the parser is built.
    monkeypatch.setenv("CBSERVE_WORKER_THREADS", "2")
    argv = ["--num-workers", "2", "--dtype", "float32", "--no-enable-prefix-caching"]
    args = PARSERS["serve"]().parse_args(argv)
    assert to_argv(args, WorkerConfig, WORKER_FLAGS) == ["--dtype", "float32", "--threads", "2"]
    assert to_argv(args, SchedulerConfig, SCHEDULER_FLAGS) == ["--no-enable-prefix-caching"]
    # What is passed on is what the worker's own parser reads back.
    worker_args = worker_parser().parse_args(to_argv(args, WorkerConfig, WORKER_FLAGS))
    assert config_from_args(worker_args, model="m").threads == 2


@pytest.mark.parametrize("cls", [WorkerConfig, *SCHEDULER_CONFIGS], ids=lambda cls: cls.__name__)
def test_serve_takes_and_passes_on_every_flag_marked_so(cls, monkeypatch):
    """A flag marked forwarded_by SERVE reaches the process without a launcher's list."""
    for each in flags_of(cls):
        for name in each.env_names:
            monkeypatch.delenv(name, raising=False)
    marked = [each for each in flags_of(cls) if SERVE in each.spec.forwarded_by]
    assert marked or cls.__name__ in ("ProcessConfig", "FaultConfig")
    serve = PARSERS["serve"]()
    options = {option for action in serve._actions for option in action.option_strings}
    for each in marked:
        assert each.option in options
        stack = stack_from_args(serve.parse_args(_an_argv_setting(each)))
        passed_on = stack.worker_args if cls is WorkerConfig else stack.scheduler_args
        if each.spec.secret:
            assert each.option not in passed_on and each.env in stack.scheduler_env
        else:
            assert each.option in passed_on or f"--no-{each.name}" in passed_on


def _an_argv_setting(each) -> list[str]:
    """A command line that sets the flag to a valid value other than its default."""
    if each.kind is bool:
        return [f"--no-{each.name}" if each.default() else each.option]
    if each.spec.choices:
        return [each.option, str(next(c for c in each.spec.choices if c != each.default()))]
    if each.field.name == "tls_cert":
        return [each.option, "cert.pem", "--tls-key", "key.pem"]
    if each.field.name == "tls_key":
        return [each.option, "key.pem", "--tls-cert", "cert.pem"]
    if each.field.name == "kv_cache_memory":
        return [each.option, "1G"]
    if each.field.name == "speculative_config":
        return [each.option, '{"method": "ngram", "num_speculative_tokens": 3}']
    if each.field.name == "kv_events_config":
        return [each.option, '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}']
    if each.field.name == "lora_modules":  # adapters need LoRA on
        return [each.option, "sql=/adapters/sql", "--enable-lora"]
    if each.field.name.startswith("null_"):  # the null model's flags need it
        return [each.option, "0.5", "--model-impl", "null"]
    return [each.option, "m" if each.kind is str else "3"]


# Every port flag that can be turned off, by command: 0 is off in each.
OFF_ABLE_PORTS = {
    "scheduler": ("--metrics-port", "--http-port"),
    "worker": ("--metrics-port",),
    "serve": ("--metrics-port", "--http-port"),
}


def _configs_of(name: str, argv: list[str]) -> list:
    if name == "scheduler":
        args = parse_args(["--worker", "w:1", *argv])
        return [*configs_from_args(args), edge_config_from_args(args)]
    if name == "worker":
        return [config_from_args(worker_parser().parse_args(argv), model="m")]
    return [build(ServeConfig, PARSERS["serve"]().parse_args(argv))]


@pytest.mark.parametrize("name", sorted(OFF_ABLE_PORTS))
def test_port_0_turns_off_and_minus_1_is_its_deprecated_alias(name, recwarn):
    for option in OFF_ABLE_PORTS[name]:
        field = option.removeprefix("--").replace("-", "_")
        for given in ("0", "-1"):
            configs = _configs_of(name, [option, given])
            [value] = [getattr(c, field) for c in configs if hasattr(c, field)]
            assert value == 0, (name, option, given)
        assert [
            getattr(c, field) for c in _configs_of(name, [option, "9999"]) if hasattr(c, field)
        ] == [9999]
    assert any("deprecated" in str(warning.message) for warning in recwarn)


@pytest.mark.parametrize("value", [-2, 65536, True, "80"])
def test_port_or_off_refuses_what_is_no_port(value):
    with pytest.raises(ValueError, match="metrics_port"):
        port_or_off("metrics_port", value)
