"""The worker's forward with LoRA adapters against PEFT on transformers, and batched.

Adapters of two ranks and two target sets with random A and B (adapters.py): float32
greedy tokens equal PEFT's `generate`; a batch that mixes base rows and several
adapters gives every row what it gets alone; the block path (q4_1) with an adapter
stays with the float forward with the same adapter.
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.lora.adapters import CASES, peft_greedy
from tests.worker.lora.conftest import as_tensor, greedy_on_slots, lora_runner

NUM_NEW = 16


# One of the four cases runs in `make test`: r16-all, whose targets include the
# attention projections the r8-attention case adapts, and the MLP's. PEFT's generate is
# most of their time (19 s a case), so the other three run in `make test-slow`.
_PEFT_CASES = [
    case.name if case.name == "r16-all" else pytest.param(case.name, marks=pytest.mark.slow)
    for case in CASES
]


@pytest.mark.parametrize("name", _PEFT_CASES)
def test_float32_greedy_equals_peft_generate(loaded_model, peft_adapters, question_ids, name):
    if loaded_model.dtype != torch.float32:
        pytest.skip("PEFT's greedy reference is float32 (CBSERVE_WORKER_TEST_DTYPE is not)")
    runner = lora_runner(loaded_model, [peft_adapters[name][0]])
    prompts = question_ids[:2]  # PEFT's generate is most of the test's time
    base, _ = greedy_on_slots(runner, prompts, [0] * len(prompts), NUM_NEW)
    got, _ = greedy_on_slots(runner, prompts, [1] * len(prompts), NUM_NEW)
    peft_model = peft_adapters[name][1]
    changed = 0
    for prompt, tokens, base_tokens in zip(prompts, got, base, strict=True):
        want = peft_greedy(peft_model, prompt, NUM_NEW)
        # generate stops at EOS; the worker goes on until told to stop.
        assert tokens[: len(want)] == want, name
        changed += tokens != base_tokens
    assert changed, f"{name} changed no reply: is the delta applied?"


# make test-slow (18 s): make test mixes base rows and four adapters in one batch on
# the native step (test_native_lora.py); a served stack answers base and adapter
# requests, one at a time, in test_http_adapters.py.
@pytest.mark.slow
def test_a_mixed_batch_gives_each_row_what_it_gets_alone(loaded_model, peft_adapters, question_ids):
    """Base rows and three adapters (more than --max-loras 1 of a step would allow: the
    worker itself computes any number) in one batch, against each prompt run alone."""
    directories = [peft_adapters[case.name][0] for case in CASES[1:]]
    runner = lora_runner(loaded_model, directories)
    prompts = [*question_ids, question_ids[0], question_ids[1]]
    slots = [0, 1, 2, 3, 0]
    together, together_logprobs = greedy_on_slots(runner, prompts, slots, NUM_NEW)
    for prompt, slot, tokens, logprobs in zip(
        prompts, slots, together, together_logprobs, strict=True
    ):
        alone, alone_logprobs = greedy_on_slots(runner, [prompt], [slot], NUM_NEW)
        assert tokens == alone[0]
        torch.testing.assert_close(
            as_tensor(logprobs), as_tensor(alone_logprobs[0]), rtol=0, atol=2e-3
        )
    # The same prompt under different adapters does differ.
    assert together[0] != together[3] or together_logprobs[0] != together_logprobs[3]


# make test-slow (14 s): make test runs adapters on the block path's native step against
# its Python forward (test_native_lora.py, 16 rows of base and four adapters), and the
# float forward's adapters against PEFT's (above).
@pytest.mark.slow
def test_block_path_with_an_adapter_stays_with_the_float_forward(
    loaded_model, q4_1, peft_adapters, question_ids
):
    """q4_1 runs the GGUF's blocks, whose values are the float32 model's: with the same
    adapter it differs only in the order of sums, as the block path's tests hold it
    without adapters. A step with adapter rows leaves the native step to the Python
    forward; the base rows beside them keep their replies."""
    directory = peft_adapters["r16-all"][0]
    slots = [1, 0, 1]
    float_tokens, float_logprobs = greedy_on_slots(
        lora_runner(loaded_model, [directory]), question_ids, slots, NUM_NEW
    )
    block_tokens, block_logprobs = greedy_on_slots(
        lora_runner(q4_1, [directory]), question_ids, slots, NUM_NEW
    )
    same = sum(b == f for b, f in zip(block_tokens, float_tokens, strict=True))
    assert same >= len(question_ids) - 1, (block_tokens, float_tokens)
    first = [lp[0] for lp in (block_logprobs[0][:5], float_logprobs[0][:5])]
    assert abs(first[0] - first[1]) < 0.05
