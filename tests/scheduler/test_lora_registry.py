"""The adapter registry and the LoRA flags: both --lora-modules forms, the refusals a
person can act on, ids that are never reused."""

from __future__ import annotations

import json

import grpc
import pytest

from common.errors import ServiceError
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.config.lora import LoraModule, parse_lora_module
from scheduler_svc.flags import configs_from_args, parse_args
from scheduler_svc.lora.registry import AdapterRegistry
from tests.scheduler.lora_dirs import make_adapter_dir

WORKER = ["--worker", "localhost:1"]


def test_both_module_forms_parse():
    assert parse_lora_module("sql=/a/sql") == LoraModule("sql", "/a/sql")
    text = json.dumps({"name": "chat", "path": "/a/chat", "base_model_name": "Base"})
    assert parse_lora_module(text) == LoraModule("chat", "/a/chat", "Base")


@pytest.mark.parametrize(
    "text",
    ["no-equals-sign", '{"name": "x"}', '{"name": "x", "path": "/p", "extra": 1}', "=/p", "{bad"],
)
def test_bad_module_is_refused(text):
    with pytest.raises(ValueError, match="lora_modules"):
        parse_lora_module(text)


def test_flags_make_the_config(tmp_path):
    chat = json.dumps({"name": "chat", "path": "/a/chat", "base_model_name": "Base"})
    argv = [*WORKER, "--enable-lora", "--lora-modules", "sql=/a/sql", chat, "--max-loras", "2"]
    _, config, _ = configs_from_args(parse_args(argv))
    lora = config.lora
    assert lora is not None
    assert [m.name for m in lora.modules] == ["sql", "chat"]
    assert lora.modules[1].base_model_name == "Base"
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (2, 16, 2)


def test_variable_holds_several_modules_with_json(monkeypatch):
    chat = json.dumps({"name": "chat", "path": "/a/chat"})
    monkeypatch.setenv("CBSERVE_SCHEDULER_LORA_MODULES", f"sql=/a/sql,{chat}")
    _, config, _ = configs_from_args(parse_args([*WORKER, "--enable-lora"]))
    assert [m.name for m in config.lora.modules] == ["sql", "chat"]


def test_lora_off_by_default():
    assert SchedulerConfig().lora is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"enable_lora": True, "max_loras": 0}, "max_loras"),
        ({"enable_lora": True, "max_loras": 3, "max_cpu_loras": 2}, "max_cpu_loras"),
        ({"lora_modules": ["a=/p"]}, "enable_lora"),
        ({"enable_lora": True, "lora_modules": ["a=/p", "a=/q"]}, "twice"),
        ({"max_lora_rank": 0}, "max_lora_rank"),
    ],
)
def test_bad_limits_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


def test_bad_flag_exits_with_usage():
    with pytest.raises(SystemExit):
        parse_args([*WORKER, "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1"])


def test_load_reads_the_config_and_counts_ids(tmp_path):
    registry = AdapterRegistry(max_lora_rank=16, served_model_name="Base")
    first = registry.load("b", str(make_adapter_dir(tmp_path, "b", rank=4)))
    second = registry.load("a", str(make_adapter_dir(tmp_path, "a", targets="q_proj")), "Other")
    assert (first.lora_id, first.rank, first.target_modules) == (1, 4, ("q_proj", "v_proj"))
    assert first.base_model_name == "Base"
    assert (second.lora_id, second.base_model_name) == (2, "Other")
    assert [info.name for info in registry.adapters()] == ["a", "b"]
    registry.unload("b")
    third = registry.load("b", first.path)
    assert third.lora_id == 3, "an id is never reused"


def _refusal(call) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call()
    return caught.value


def test_refusals_carry_status_and_reason(tmp_path):
    registry = AdapterRegistry(max_lora_rank=8, served_model_name="Base")
    good = str(make_adapter_dir(tmp_path, "good"))
    registry.load("good", good)
    cases = [
        (lambda: registry.load("x", str(tmp_path / "missing")), "NOT_FOUND", "does not exist"),
        (lambda: registry.get("nope"), "NOT_FOUND", "not loaded"),
        (lambda: registry.unload("nope"), "NOT_FOUND", "not loaded"),
        (lambda: registry.load("good", good), "INVALID_ARGUMENT", "already loaded"),
        (lambda: registry.load("Base", good), "INVALID_ARGUMENT", "served model"),
        (
            lambda: registry.load("big", str(make_adapter_dir(tmp_path, "big", rank=32))),
            "INVALID_ARGUMENT",
            "max-lora-rank",
        ),
        (
            lambda: registry.load("ia3", str(make_adapter_dir(tmp_path, "ia3", peft_type="IA3"))),
            "INVALID_ARGUMENT",
            "only LORA",
        ),
        (
            lambda: registry.load("nw", str(make_adapter_dir(tmp_path, "nw", weights=False))),
            "INVALID_ARGUMENT",
            "adapter_model.safetensors",
        ),
        (lambda: registry.load("e", str(tmp_path)), "INVALID_ARGUMENT", "adapter_config.json"),
    ]
    for call, code, words in cases:
        error = _refusal(call)
        assert error.code == getattr(grpc.StatusCode, code), error
        assert words in error.message
    assert [info.name for info in registry.adapters()] == ["good"]


def test_from_config_loads_the_modules(tmp_path):
    path = make_adapter_dir(tmp_path, "sql")
    config = SchedulerConfig(enable_lora=True, lora_modules=[f"sql={path}"]).lora
    registry = AdapterRegistry.from_config(config, "Base")
    assert registry.get("sql").lora_id == 1


@pytest.mark.parametrize("path", ["~no-such-user-here/adapter", "a\x00b", "/no/such/dir"])
def test_a_path_that_names_no_directory_is_not_found(path):
    # Any text a client sends as lora_path is answered, never a crash (HTTP 500).
    with pytest.raises(ServiceError) as raised:
        AdapterRegistry(16, "base").load("x", path)
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
