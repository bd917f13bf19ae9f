"""Real scheduler and worker processes on loopback, on the default model.

Stacks are started once per session; the transformers reference outputs are
read from the on-disk cache (tests/reference_cache.py), computed there on a miss.
After every test, each stack started through `started_stack` must come back to an idle state with no
KV block held (the cbserve_kv_blocks_used gauge at 0): a leaked block fails the
test that leaked it.
"""

from __future__ import annotations

import pytest

from cbserve.client import Client
from cbserve.local_stack import free_port
from common.defaults import default_model_path
from scheduler_svc.api.tokenizer import Tokenizer
from tests.integration.liveness import WORKER_ARGS, WORKER_TIMEOUT_S, bring_back_workers
from tests.integration.prompts import mixed_prompts
from tests.integration.stacks import running_stacks, started_stack, stop_stack, wait_until_idle
from tests.reference_cache import GreedyReference, greedy_outputs

GREEDY_TOKENS = 32
NUM_PROMPTS = 16
# Small enough that every prompt above 32 tokens is prefilled over several steps.
CHUNK_BUDGET = 32
CHUNKED_POOL_BLOCKS = 256
POOL_STACK_BLOCKS = 128


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
    """The session's plain stack, for every module that only reads from it: a float32
    worker with the default pool, and a scheduler serving the OpenAI-compatible HTTP
    front too (stack.http_port). Modules that kill, stop or flag a process, or need
    a pool of a given size, start their own."""
    port = free_port()
    running = started_stack(
        worker_args=["--dtype", "float32"], scheduler_args=["--http-port", str(port)]
    )
    running.http_port = port
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


@pytest.fixture(scope="session")
def pool_stack():
    """A worker with exactly POOL_STACK_BLOCKS blocks that serves its own metrics (on a
    free port), for the modules that read exact block counts, counter deltas or the
    worker's /metrics and only read from it (test_reflection, test_ops_metrics)."""
    running = started_stack(
        worker_args=["--dtype", "float32", "--num-kv-blocks", str(POOL_STACK_BLOCKS)],
        worker_metrics_ports=[0],
    )
    yield running
    stop_stack(running)


@pytest.fixture(scope="session")
def two_worker_stack():
    """Two one-thread workers, each serving its own /metrics, whose scheduler finds a
    lost one within WORKER_TIMEOUT_S: one stack for the modules that kill or stop them
    (test_structured_faults, test_worker_faults) and for test_multi_worker. Tests take
    it through `two_workers`, which first brings back what a test before left down."""
    running = started_stack(
        num_workers=2,
        worker_args=WORKER_ARGS,
        worker_metrics_ports=[0, 0],
        scheduler_args=["--worker-timeout", str(WORKER_TIMEOUT_S)],
    )
    yield running
    stop_stack(running)


@pytest.fixture
def two_workers(two_worker_stack):
    bring_back_workers(two_worker_stack)
    return two_worker_stack


@pytest.fixture
def client(stack):
    with Client(stack.address) as connected:
        yield connected


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    return mixed_prompts(tokenizer, NUM_PROMPTS)


def integration_reference(prompts: list[list[int]] | None = None) -> GreedyReference:
    """transformers' float32 greedy continuations of the mixed prompts, EOS ignored
    (as the requests do with ignore_eos)."""
    if prompts is None:
        prompts = mixed_prompts(Tokenizer(default_model_path()), NUM_PROMPTS)
    return GreedyReference(
        name="integration-mixed",
        model_path=default_model_path(),
        prompts=tuple(tuple(prompt) for prompt in prompts),
        max_new_tokens=GREEDY_TOKENS,
        ignore_eos=True,
    )


@pytest.fixture(scope="session")
def reference_outputs(prompts) -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time, EOS ignored; from the
    on-disk cache (tests/reference_cache.py, `make test-refs`) when it holds them."""
    return greedy_outputs(integration_reference(prompts))


@pytest.fixture(scope="session")
def http_stack(stack):
    """The stack whose HTTP front the HTTP tests use: the session's stack."""
    return stack


@pytest.fixture(scope="session")
def http_base_url(http_stack) -> str:
    return f"http://127.0.0.1:{http_stack.http_port}"


@pytest.fixture(scope="session")
def openai_api(http_base_url):
    """The official SDK on http_stack's front; no retries, so that refusals are seen."""
    import openai

    with openai.OpenAI(base_url=f"{http_base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client
