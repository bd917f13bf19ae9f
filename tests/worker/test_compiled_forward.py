"""The worker's --compile: the torch.compile'd own forward (models/forward/compiled.py) samples
the same float32 greedy tokens as the eager one, and one graph serves every flat
batch length >= 2 (prefills and decodes alike), so steps do not recompile.

One compile of the 30-layer graph takes about a minute on 2 cores with a cold
Inductor cache (CI's), so the test compiles the model's first two layers only:
equality with eager asks nothing of depth, and the graph has every kind of
operation and custom op the whole model's has. It compiles one graph only; the
worker's start-up warm-up compiles all three.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch._dynamo.utils

from cbserve.worker.v1 import worker_pb2 as pb
from tests.worker.conftest import build_runner
from worker_svc.config import WorkerConfig
from worker_svc.models.forward.compiled import CompiledForward

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
)
DECODE_STEPS = 12


def greedy_tokens(runner, prompts: list[list[int]]) -> dict[int, list[int]]:
    """All prompts prefilled in one step, then DECODE_STEPS decode steps of all of them."""
    tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    plan = pb.StepPlan(
        new_sequences=[
            pb.NewSequence(
                seq_id=i,
                prompt_token_ids=ids,
                num_scheduled_tokens=len(ids),
                block_ids=list(range(i * 4, i * 4 + 4)),
                sampling=GREEDY,
            )
            for i, ids in enumerate(prompts)
        ]
    )
    for _ in range(1 + DECODE_STEPS):
        result = runner.execute(plan)
        for seq_id, token in zip(result.seq_ids, result.token_ids, strict=True):
            tokens[seq_id].append(token)
        plan = pb.StepPlan(
            continuing_sequences=[
                pb.ContinuingSequence(seq_id=i, num_scheduled_tokens=1) for i in tokens
            ]
        )
    return tokens


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(text).input_ids for text in PROMPTS]


def first_layers(loaded_model, num_layers: int):
    """The loaded model cut to its first layers (the shared ones, not copies of them)."""
    shallow = copy.copy(loaded_model.model)
    # nn.Module keeps its children in _modules: a copy must not share that dict.
    shallow._modules = dict(loaded_model.model._modules)
    shallow.layers = torch.nn.ModuleList(list(loaded_model.model.layers)[:num_layers])
    return dataclasses.replace(loaded_model, model=shallow)


# Slow: compiling the graphs takes 20 s; `make test-slow` runs it.
@pytest.mark.slow
def test_compiled_float32_greedy_tokens_equal_eager(loaded_model, prompt_ids):
    if loaded_model.dtype != torch.float32:
        pytest.fail("token equality is asked of the float32 reference path")
    shallow = first_layers(loaded_model, 2)
    eager = greedy_tokens(build_runner(shallow), prompt_ids)
    # The same modules and weights, behind the compiled call.
    compiled_model = dataclasses.replace(shallow, model=CompiledForward(shallow.model))
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = greedy_tokens(build_runner(compiled_model), prompt_ids)

    assert compiled == eager
    assert all(len(tokens) == 1 + DECODE_STEPS for tokens in compiled.values())
    # The prefill (T = sum of prompt lengths) and the decodes (T = 3): one graph.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before == 1


def test_compile_needs_the_own_forward():
    assert WorkerConfig(compile=True).compile
    with pytest.raises(ValueError, match="compile needs the own forward"):
        WorkerConfig(compile=True, model_impl="transformers")
    # Compiled int8 is not logprobs-close to float32 (test_compute_paths_close.py, slow).
    with pytest.raises(ValueError, match="compile with dtype int8 is not logprobs-close"):
        WorkerConfig(compile=True, dtype="int8")
