"""Real scheduler and worker processes on loopback, on the default model.

Stacks are started once per session; the transformers reference outputs are
computed once, in this process, one prompt at a time. After every test, each
stack started through `started_stack` must come back to an idle state with no
KV block held (the cbserve_kv_blocks_used gauge at 0): a leaked block fails the
test that leaked it.
"""

from __future__ import annotations

import pytest

from cbserve.client import Client
from cbserve.local_stack import free_port
from common.defaults import default_model_path
from scheduler_svc.api.tokenizer import Tokenizer
from tests.integration.prompts import mixed_prompts
from tests.integration.stacks import running_stacks, started_stack, stop_stack, wait_until_idle

GREEDY_TOKENS = 32
# Small enough that every prompt above 32 tokens is prefilled over several steps.
CHUNK_BUDGET = 32
CHUNKED_POOL_BLOCKS = 256


@pytest.fixture(autouse=True)
def no_leaked_blocks():
    yield
    for stack in running_stacks():
        wait_until_idle(stack)


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer(default_model_path())


@pytest.fixture(scope="session")
def stack():
    running = started_stack(worker_args=["--dtype", "float32"])
    yield running
    stop_stack(running)


@pytest.fixture(scope="session")
def chunked_stack():
    """Chunked prefill, and no prefix cache: the reference for the cache's outputs."""
    running = started_stack(
        worker_args=["--dtype", "float32", "--num-kv-blocks", str(CHUNKED_POOL_BLOCKS)],
        scheduler_args=[
            "--max-num-batched-tokens",
            str(CHUNK_BUDGET),
            "--no-enable-prefix-caching",
        ],
    )
    yield running
    stop_stack(running)


@pytest.fixture
def client(stack):
    with Client(stack.address) as connected:
        yield connected


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    return mixed_prompts(tokenizer, 16)


@pytest.fixture(scope="session")
def reference_outputs(prompts) -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time, EOS ignored."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32).eval()
    # Keep generating past EOS, as the requests do with ignore_eos.
    model.generation_config.eos_token_id = None
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            generated = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="session")
def http_stack():
    """A stack serving the OpenAI-compatible HTTP front too (stack.http_port)."""
    port = free_port()
    running = started_stack(
        worker_args=["--dtype", "float32"], scheduler_args=["--http-port", str(port)]
    )
    running.http_port = port
    yield running
    stop_stack(running)


@pytest.fixture(scope="session")
def http_base_url(http_stack) -> str:
    return f"http://127.0.0.1:{http_stack.http_port}"


@pytest.fixture(scope="session")
def openai_api(http_base_url):
    """The official SDK on http_stack's front; no retries, so that refusals are seen."""
    import openai

    with openai.OpenAI(base_url=f"{http_base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client
