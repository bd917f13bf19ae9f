"""--kv-cache-dtype on the real default model (float32 compute): a 16-bit pool answers
the README's question as a float32 pool does, its logits stay within the measured
distance of the float32 pool's, and a worker built with it has the pool, the backend and
the block count it should.

Tolerances, measured on this model after prefills of 5 to 450 tokens, one decode each:
a float16 pool's logits are within 4.5e-4 of the largest logit from a float32 pool's
(about one float16 rounding, 2**-11 of a value, carried through 30 layers); a bfloat16
pool's (8 significant bits instead of 11) within 1.8e-3. Each bound below is about twice
its measurement, and the float16 one is below bfloat16's measurement, so a "float16"
pool that rounded like bfloat16 fails it, as one that silently stayed float32 fails the
check that the logits moved at all."""

from __future__ import annotations

import random

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path
from tests.worker.conftest import build_runner
from tests.worker.native_step import decode_step
from worker_svc.attention import BackendUnavailableError, select_backend
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPoolSpec
from worker_svc.startup import build_worker

pytestmark = pytest.mark.model

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
CONTEXTS = (450, 200, 70, 37, 5, 12, 12, 12)
BLOCK_SIZE = 16
LOGITS_RTOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def decode_logits(loaded, kv_dtype: torch.dtype | None) -> torch.Tensor:
    """Every sequence prefilled (random tokens), then one decode step's logits."""
    runner = build_runner(loaded, num_blocks=128, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
    rng = random.Random(0)
    free = list(range(runner.pool.num_blocks))
    rng.shuffle(free)
    plan = pb.StepPlan()
    for seq_id, context in enumerate(CONTEXTS):
        tokens = [rng.randrange(100, 40000) for _ in range(context - 1)]
        blocks = [free.pop() for _ in range(-(-(context + 1) // BLOCK_SIZE))]
        plan.new_sequences.append(
            pb.NewSequence(
                seq_id=seq_id,
                prompt_token_ids=tokens,
                num_scheduled_tokens=len(tokens),
                block_ids=blocks,
                sampling=GREEDY,
            )
        )
    runner.execute(plan)
    ids, positions, context = decode_step(runner, list(range(len(CONTEXTS))))
    with torch.inference_mode():
        return loaded.model(ids, positions, context, torch.arange(len(CONTEXTS)))


@pytest.fixture(scope="module")
def float32_pool_logits(loaded_model):
    if loaded_model.dtype != torch.float32:
        pytest.skip("measured against float32 compute")
    return decode_logits(loaded_model, None)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_decode_logits_near_the_float32_pools(loaded_model, float32_pool_logits, kv_dtype):
    reference = float32_pool_logits
    logits = decode_logits(loaded_model, kv_dtype)
    error = float((logits - reference).abs().max() / reference.abs().max())
    assert 0 < error < LOGITS_RTOL[kv_dtype], f"relative error {error:.2e}"
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_the_readme_question_is_answered_as_with_a_float32_pool(loaded_model):
    from bench.accuracy.eval import greedy_replies
    from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer

    tok = Tokenizer(default_model_path())
    prompt = [tok.encode_chat([ChatTurn("user", "What is the capital of France?")])]
    reply = greedy_replies(loaded_model, prompt, 16, kv_dtype=torch.float16)
    assert reply == greedy_replies(loaded_model, prompt, 16)
    assert tok.decode(reply[0]).startswith("The capital of France is Paris.")


def test_a_worker_with_a_float16_pool():
    """The startup path: the pool in float16, read by the C kernel, twice the blocks."""
    budget = 64 << 20
    config = WorkerConfig(
        model=default_model_path(),
        dtype="float32",
        kv_cache_dtype="float16",
        kv_cache_memory=budget,
        threads=2,
    )
    worker = build_worker(config)
    pool = worker.runner.pool
    assert pool.cache.dtype == torch.float16 and pool.num_bytes <= budget
    assert worker.description.attention_backend == "cpu"
    float32_block = KVPoolSpec(
        pool.spec.num_layers, pool.spec.num_kv_heads, pool.spec.head_dim, BLOCK_SIZE, torch.float32
    ).bytes_per_block
    assert worker.description.num_kv_blocks == 2 * (budget // float32_block)


def test_the_q4_1_worker_takes_a_float16_pool_by_default():
    """--kv-cache-dtype auto on the q4_1 path: float16, read by the native step."""
    config = WorkerConfig(
        model=default_model_path(), dtype="q4_1", kv_cache_memory=16 << 20, threads=2
    )
    worker = build_worker(config)
    assert worker.runner.pool.cache.dtype == torch.float16
    assert worker.description.attention_backend == "cpu"
    float32 = build_worker(
        WorkerConfig(model=default_model_path(), dtype="float32", kv_cache_memory=16 << 20)
    )
    assert float32.runner.pool.cache.dtype == torch.float32  # the reference stays float32


def test_a_null_worker_sizes_its_pool_as_a_float16_worker_would():
    from worker_svc.null.worker import build_null_worker

    def blocks(kv_cache_dtype: str) -> int:
        config = WorkerConfig(
            model=default_model_path(),
            model_impl="null",
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory=64 << 20,
        )
        return build_null_worker(config).description.num_kv_blocks

    assert blocks("float16") == 2 * blocks("auto")


def test_backends_by_pool_dtype():
    cpu, dtype = torch.device("cpu"), torch.float32
    backend, _ = select_backend("auto", cpu, dtype, BLOCK_SIZE, 64, kv_dtype=torch.float16)
    assert backend.name == "cpu"
    # No C kernel reads bfloat16: auto falls back to torch and says why; "cpu" refuses.
    backend, why = select_backend("auto", cpu, dtype, BLOCK_SIZE, 64, kv_dtype=torch.bfloat16)
    assert backend.name == "torch" and "bfloat16" in why
    with pytest.raises(BackendUnavailableError, match="bfloat16"):
        select_backend("cpu", cpu, dtype, BLOCK_SIZE, 64, kv_dtype=torch.bfloat16)
