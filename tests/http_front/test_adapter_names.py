"""How the HTTP front reads `model` with LoRA on and off (fast tier: the pool's real
adapter half over a real registry, no process): the served name or none is the base,
a loaded adapter is itself, any other name is OpenAI's 404 only with LoRA on."""

from __future__ import annotations

import pytest

from cbserve.v1 import generation_pb2 as pb
from scheduler_svc.api.http.adapters import adapter_cards, lora_name_for, name_adapter
from scheduler_svc.api.http.errors import OpenAIError
from scheduler_svc.api.http.translate import Choice
from scheduler_svc.lora.registry import AdapterRegistry
from scheduler_svc.workers.pool_adapters import PoolAdapters
from tests.scheduler.lora_dirs import make_adapter_dir

BASE = "SmolLM2-135M-Instruct"


class Pool(PoolAdapters):
    def __init__(self, registry: AdapterRegistry | None) -> None:
        self.registry = registry
        self.engines = {}


@pytest.fixture
def lora_pool(tmp_path) -> Pool:
    registry = AdapterRegistry(16, BASE)
    registry.load("sql", str(make_adapter_dir(tmp_path, "sql")))
    return Pool(registry)


def test_the_served_name_or_none_is_the_base_and_an_adapter_is_itself(lora_pool):
    assert lora_name_for(None, BASE, lora_pool) == ""
    assert lora_name_for("", BASE, lora_pool) == ""
    assert lora_name_for(BASE, BASE, lora_pool) == ""
    assert lora_name_for("sql", BASE, lora_pool) == "sql"


def test_any_other_name_is_not_found_with_lora_on(lora_pool):
    with pytest.raises(OpenAIError) as raised:
        lora_name_for("gpt-4o", BASE, lora_pool)
    body = raised.value.body()["error"]
    assert raised.value.status == 404
    assert (body["type"], body["param"]) == ("not_found_error", "model")
    assert body["code"] == "model_not_found"


def test_with_lora_off_the_name_is_not_checked():
    # As before adapters existed: clients that send any name keep working.
    assert lora_name_for("any", BASE, Pool(None)) == ""
    assert adapter_cards(Pool(None), 0, 2048) == []


def test_every_choice_generates_with_the_adapter():
    choices = [Choice(i, 0, pb.GenerateRequest(prompt="x")) for i in range(2)]
    name_adapter(choices, "sql")
    assert [choice.request.lora_name for choice in choices] == ["sql", "sql"]


def test_cards_name_the_parent_and_the_directory(lora_pool, tmp_path):
    [card] = adapter_cards(lora_pool, 7, 2048)
    assert card["id"] == "sql" and card["parent"] == BASE
    assert card["root"] == str((tmp_path / "sql").resolve())
    assert (card["object"], card["created"], card["max_model_len"]) == ("model", 7, 2048)
