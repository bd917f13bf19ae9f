"""LoRA adapters over the HTTP front, through the official `openai` client, on a real
stack started with vLLM's flags: `model` naming an adapter, /v1/models listing each with
its parent, vLLM's load and unload routes and answers, an unknown name as
openai.NotFoundError, and an adapter over --max-lora-rank refused at load while the
service keeps serving.

The adapters are made here on the default model with random A and B (bench/lora_adapters.py):
PEFT's own init leaves B zero, and then a missing delta would look like a served one."""

from __future__ import annotations

import subprocess
import sys

import httpx2 as httpx
import openai
import pytest

from bench.lora_adapters import ALL_TARGETS, ATTENTION_TARGETS, load_base, make_adapter
from cbserve.client import Client
from cbserve.local_stack import free_port
from tests.integration.stacks import started_stack, stop_stack

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0.0, "max_tokens": 12}
MAX_RANK = 8
LIMITS = ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "3"]
LIMITS += ["--max-lora-rank", str(MAX_RANK)]
SUCCESS_LOADED = "Success: LoRA adapter '{}' added successfully."
SUCCESS_REMOVED = "Success: LoRA adapter '{}' removed successfully."


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    """name -> directory: two servable ranks and target sets, and one over MAX_RANK."""
    root = tmp_path_factory.mktemp("adapters")
    base = load_base()
    shapes = {
        "sql": (MAX_RANK, ALL_TARGETS),
        "chat": (4, ATTENTION_TARGETS),
        "wide": (2 * MAX_RANK, ATTENTION_TARGETS),
    }
    return {
        name: str(make_adapter(root / name, rank=rank, targets=targets, seed=i, base_model=base))
        for i, (name, (rank, targets)) in enumerate(shapes.items(), start=1)
    }


@pytest.fixture(scope="module")
def lora_stack(adapters):
    port = free_port()
    scheduler = ["--http-port", str(port), *LIMITS, "--lora-modules", f"sql={adapters['sql']}"]
    running = started_stack(worker_args=["--dtype", "float32", *LIMITS], scheduler_args=scheduler)
    running.http_port = port
    yield running
    stop_stack(running)


@pytest.fixture(scope="module")
def root(lora_stack) -> str:
    return f"http://127.0.0.1:{lora_stack.http_port}"


@pytest.fixture(scope="module")
def api(root):
    with openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def base_name(api) -> str:
    return api.models.list().data[0].id


def _post(root: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{root}{path}", json=body, timeout=60)


def _load(root: str, name: str, path: str) -> httpx.Response:
    return _post(root, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def test_model_names_the_adapter_and_the_reply_is_its_own(lora_stack, api, base_name):
    base = api.completions.create(model=base_name, prompt=PROMPT, **GREEDY)
    tuned = api.completions.create(model="sql", prompt=PROMPT, **GREEDY)
    assert (base.model, tuned.model) == (base_name, "sql")
    # Random A and B on every projection: the delta moves greedy tokens.
    assert tuned.choices[0].text != base.choices[0].text
    with Client(lora_stack.address) as grpc_client:
        over_grpc = grpc_client.complete(PROMPT, lora_name="sql", temperature=0.0, max_tokens=12)
    assert tuned.choices[0].text == over_grpc.text
    # No model is the base too; so is chat under the served name.
    unnamed = httpx.post(
        f"{api.base_url}completions", json={"prompt": PROMPT, **GREEDY}, timeout=60
    ).json()
    assert unnamed["choices"][0]["text"] == base.choices[0].text
    chat = api.chat.completions.create(model="sql", messages=CHAT, **GREEDY)
    assert chat.model == "sql" and chat.choices[0].message.content


def test_models_lists_the_base_then_each_adapter_with_its_parent(api, adapters, base_name):
    cards = [card.model_dump() for card in api.models.list().data]
    assert cards[0]["id"] == base_name and cards[0].get("parent") is None
    by_id = {card["id"]: card for card in cards[1:]}
    assert by_id["sql"]["parent"] == base_name
    assert by_id["sql"]["root"] == adapters["sql"]
    assert by_id["sql"]["object"] == "model"


def test_an_unknown_model_is_not_found(api):
    with pytest.raises(openai.NotFoundError) as raised:
        api.completions.create(model="no-such-adapter", prompt=PROMPT, **GREEDY)
    assert raised.value.body["code"] == "model_not_found"
    assert raised.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="no-such-adapter", messages=CHAT, stream=True, **GREEDY)


def test_load_use_and_unload_at_run_time(root, api, adapters):
    loaded = _post(
        root, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": adapters["chat"]}
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == SUCCESS_LOADED.format("chat")
    assert loaded.headers["content-type"].startswith("text/plain")
    assert "chat" in {card.id for card in api.models.list().data}
    streamed = api.completions.create(model="chat", prompt=PROMPT, stream=True, **GREEDY)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
    # A second load of the name is vLLM's 400; the first stays served.
    again = _post(
        root, "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": adapters["chat"]}
    )
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]

    removed = _post(root, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert removed.status_code == 200 and removed.text == SUCCESS_REMOVED.format("chat")
    assert "chat" not in {card.id for card in api.models.list().data}
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="chat", prompt=PROMPT, **GREEDY)
    gone = _post(root, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"


def test_a_bad_load_is_refused_with_its_reason_and_the_service_stays_up(root, api, adapters):
    over = _post(
        root, "/v1/load_lora_adapter", {"lora_name": "wide", "lora_path": adapters["wide"]}
    )
    assert over.status_code == 400
    assert "rank" in over.json()["error"]["message"] and str(MAX_RANK) in over.text
    missing = _load(root, "x", "/no/such/dir")
    assert missing.status_code == 404
    assert _post(root, "/v1/load_lora_adapter", {"lora_name": "x"}).status_code == 400
    ids = {card.id for card in api.models.list().data}
    assert "wide" not in ids and "x" not in ids
    # Still serving, base and adapter alike.
    assert api.completions.create(model="sql", prompt=PROMPT, **GREEDY).choices[0].text
    assert httpx.get(f"{root}/health", timeout=10).status_code == 200


def test_the_routes_exist_only_with_lora_on(http_base_url, openai_api):
    # The session's stack has no --enable-lora: no routes, and `model` is not checked.
    body = {"lora_name": "sql", "lora_path": "/tmp"}
    assert _post(http_base_url, "/v1/load_lora_adapter", body).status_code == 404
    reply = openai_api.completions.create(model="any-name", prompt=PROMPT, max_tokens=2)
    assert reply.choices[0].text


def test_cbserve_generate_takes_the_adapter_by_name(lora_stack, api):
    over_http = api.completions.create(model="sql", prompt=PROMPT, **GREEDY).choices[0].text
    command = [sys.executable, "-m", "cbserve.cli", "generate", "--server", lora_stack.address]
    command += ["--max-tokens", "12", PROMPT]
    tuned = subprocess.run([*command, "--lora-name", "sql"], capture_output=True, text=True)
    assert tuned.returncode == 0, tuned.stderr
    assert tuned.stdout == over_http + "\n"
    unknown = subprocess.run([*command, "--lora-name", "nope"], capture_output=True, text=True)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr


# make test-slow (12 s): make test serves adapters through one front (above) and N API
# processes without adapters (test_api_processes*.py).
@pytest.mark.slow
def test_with_api_processes_the_front_serves_the_cores_adapters(adapters):
    # The HTTP front runs in an API process: its routes exist from the start, and a load
    # there registers the adapter in the core, where requests of every process find it.
    port = free_port()
    scheduler = ["--http-port", str(port), *LIMITS, "--api-processes", "1"]
    split = started_stack(worker_args=["--dtype", "float32", *LIMITS], scheduler_args=scheduler)
    try:
        root = f"http://127.0.0.1:{port}"
        assert _load(root, "chat", adapters["chat"]).status_code == 200
        with openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0) as api:
            reply = api.completions.create(model="chat", prompt=PROMPT, **GREEDY)
            assert reply.model == "chat" and reply.choices[0].text
            assert _post(root, "/v1/unload_lora_adapter", {"lora_name": "chat"}).status_code == 200
            with pytest.raises(openai.NotFoundError):
                api.completions.create(model="chat", prompt=PROMPT, **GREEDY)
    finally:
        stop_stack(split)
