"""The LoRA model tests' adapters (made once a session) and runners that carry slots."""

from __future__ import annotations

import pytest
import torch

from bench.accuracy.eval import greedy_batch_plans
from tests.worker.conftest import build_runner
from tests.worker.lora.adapters import CASES, make_peft_adapter
from worker_svc.lora.loading import enable_lora
from worker_svc.lora.peft_reader import read_peft_adapter
from worker_svc.lora.slots import LoraLimits
from worker_svc.model_loader import LoadedModel
from worker_svc.model_runner import ModelRunner

BLOCK_SIZE = 16
QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Why do cats purr?",
)


@pytest.fixture(scope="session")
def peft_adapters(tmp_path_factory) -> dict[str, tuple[str, object]]:
    """case name -> (its saved directory, its PEFT model), for every case of adapters.py."""
    made = {}
    for seed, case in enumerate(CASES):
        directory = tmp_path_factory.mktemp(case.name)
        made[case.name] = (str(directory), make_peft_adapter(case, directory, seed))
    return made


@pytest.fixture(scope="session")
def question_ids(tokenizer) -> list[list[int]]:
    prompts = []
    for question in QUESTIONS:
        turn = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=True)
        prompts.append(ids if isinstance(ids, list) else ids["input_ids"])
    return prompts


def lora_runner(loaded: LoadedModel, directories: list[str], num_blocks: int = 96):
    """A fresh runner over `loaded` with adapter i of `directories` in slot i + 1 (the
    model's layers take this runner's slots: one such runner at a time per model)."""
    runner = build_runner(loaded, num_blocks=num_blocks, block_size=BLOCK_SIZE)
    slots = enable_lora(runner, LoraLimits(max(len(directories), 1), 1, 16))
    for slot, directory in enumerate(directories, start=1):
        adapter = read_peft_adapter(directory, slots)
        slots.write(slot, adapter.weights, adapter.scaling)
    return runner


def greedy_on_slots(
    runner: ModelRunner, prompts: list[list[int]], slots: list[int], max_tokens: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Each prompt's greedy tokens and their top-5 logprobs, all prompts in one batch,
    prompt i computed with adapter slot slots[i] (0: the base)."""
    per_seq = -(-(max(map(len, prompts)) + max_tokens) // BLOCK_SIZE)
    first, decode = greedy_batch_plans(prompts, per_seq, num_logprobs=5)
    for new, slot in zip(first.new_sequences, slots, strict=True):
        new.adapter_slot = slot
    tokens: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    for step in range(max_tokens):
        result = runner.execute(first if step == 0 else decode)
        for index, sid in enumerate(result.seq_ids):
            tokens[sid].append(result.token_ids[index])
            logprobs[sid].extend(result.logprobs[index].top_logprobs)
    runner.execute(type(first)(step_id=max_tokens, finished_seq_ids=range(len(prompts))))
    return tokens, logprobs


def as_tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)
