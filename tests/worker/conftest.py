"""Fixtures for the worker tests: the default model, loaded once per session, on CPU.

CBSERVE_WORKER_TEST_DTYPE=bfloat16 runs the model tests (ours and transformers'
reference) in bfloat16 instead of float32: that is how the default dtype is
chosen (see bench/micro/measure_dtype.py). CBSERVE_WORKER_TEST_COMPILE=1 loads it with the
worker's --compile (torch.compile), for running the greedy-equality tests against
transformers' `generate` on the compiled forward (tests/worker/test_worker_model_runner.py;
the layer-by-layer test needs the eager modules).
"""

from __future__ import annotations

import os

import pytest
import torch

from common.defaults import default_model_path
from worker_svc.attention import AttentionBackend, select_backend
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import LoadedModel, load_model
from worker_svc.model_runner import ModelRunner
from worker_svc.sampler import Sampler

TEST_DTYPE = getattr(torch, os.environ.get("CBSERVE_WORKER_TEST_DTYPE", "float32"))
TEST_COMPILE = os.environ.get("CBSERVE_WORKER_TEST_COMPILE") == "1"


@pytest.fixture(scope="session")
def loaded_model() -> LoadedModel:
    torch.set_num_threads(2)
    return load_model(default_model_path(), TEST_DTYPE, torch.device("cpu"), compile=TEST_COMPILE)


@pytest.fixture(scope="session")
def reference_model():
    """transformers' own model (stock sdpa attention), for comparing against `generate`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        default_model_path(), dtype=TEST_DTYPE, attn_implementation="sdpa"
    )
    return model.eval()


@pytest.fixture(scope="session")
def q4_1() -> LoadedModel:
    """The default model on the q4_1 path with its native decode step (the native-step
    tests detach and restore `model.native_decode` around what they compare)."""
    torch.set_num_threads(2)
    loaded = load_model(default_model_path(), "q4_1", torch.device("cpu"))
    if loaded.model.native_decode is None:
        pytest.skip(f"native decode unavailable: {loaded.model.native_decode_status}")
    return loaded


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


def build_runner(
    loaded: LoadedModel,
    num_blocks: int = 128,
    block_size: int = 16,
    seed: int = 0,
    backend: AttentionBackend | None = None,
    kv_dtype: torch.dtype | None = None,
) -> ModelRunner:
    """A fresh runner (own pool, empty state) over a shared model; by default with the
    attention backend a worker picks here (the CPU kernel where it builds), and a pool
    in the model's dtype (`kv_dtype`: the worker's --kv-cache-dtype)."""
    kv_dtype = kv_dtype or loaded.dtype
    if backend is None:
        backend, _ = select_backend(
            "auto", loaded.device, loaded.dtype, block_size, loaded.head_dim, kv_dtype
        )
    spec = KVPoolSpec(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        block_size=block_size,
        dtype=kv_dtype,
    )
    return ModelRunner(loaded, KVPool(spec, num_blocks), backend, Sampler(seed=seed))


@pytest.fixture(scope="session")
def make_runner(loaded_model):
    """`make_runner(num_blocks=..., block_size=..., seed=...)`: a fresh runner each call."""

    def make(**kwargs) -> ModelRunner:
        return build_runner(loaded_model, **kwargs)

    return make
