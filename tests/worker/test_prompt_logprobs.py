"""Prompt logprobs from the runner's flat batch against transformers' own logits (float32,
to 1e-4): in one prefill, and spread over chunks beside another sequence's decode, on
the own forward and on transformers' modules (--model-impl transformers)."""

from __future__ import annotations

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path
from tests.worker.conftest import TEST_DTYPE, build_runner
from worker_svc.model_loader import load_model

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
TEXT = (
    "Continuous batching lets an inference server admit new requests at every model "
    "step, so short replies never wait behind long ones."
)
NUM_TOP = 3
TOLERANCE = 1e-4 if TEST_DTYPE is torch.float32 else 5e-2


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer(TEXT)["input_ids"]


@pytest.fixture(scope="module")
def expected(reference_model, prompt) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at each prompt position but the last."""
    with torch.inference_mode():
        logits = reference_model(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(-1)


@pytest.fixture(scope="module")
def transformers_model():
    torch.set_num_threads(2)
    return load_model(
        default_model_path(), TEST_DTYPE, torch.device("cpu"), model_impl="transformers"
    )


def _scored(results: list[pb.StepResult], seq_id: int) -> list[pb.PromptLogprobs]:
    return [p for r in results for p in r.prompt_logprobs if p.seq_id == seq_id]


def _check(slices: list[pb.PromptLogprobs], prompt: list[int], expected: torch.Tensor) -> None:
    positions = [s.first_position + i for s in slices for i in range(len(s.logprobs))]
    assert positions == list(range(1, len(prompt)))
    got = torch.tensor([v for s in slices for v in s.logprobs])
    want = expected.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    assert torch.allclose(got, want, atol=TOLERANCE, rtol=0)
    tops = [v for s in slices for v in s.top_logprobs]
    top_ids = [v for s in slices for v in s.top_token_ids]
    want_top, want_ids = expected.topk(NUM_TOP, dim=-1)
    assert torch.allclose(torch.tensor(tops).view(-1, NUM_TOP), want_top, atol=TOLERANCE, rtol=0)
    # Ids may only differ where two alternatives tie within the tolerance.
    assert (torch.tensor(top_ids).view(-1, NUM_TOP) == want_ids).float().mean() > 0.99


def _new(seq_id, prompt, scheduled, blocks, prompt_logprobs=NUM_TOP) -> pb.NewSequence:
    return pb.NewSequence(
        seq_id=seq_id,
        prompt_token_ids=prompt,
        num_scheduled_tokens=scheduled,
        block_ids=blocks,
        sampling=GREEDY,
        prompt_logprobs=prompt_logprobs,
    )


def _whole_then_chunked(runner, prompt: list[int]) -> tuple[list, list]:
    whole = runner.execute(
        pb.StepPlan(step_id=1, new_sequences=[_new(1, prompt, len(prompt), [0, 1, 2])])
    )
    assert list(whole.seq_ids) == [1]
    # Another sequence decodes beside the chunks, so rows of both are in each batch.
    results = [
        runner.execute(
            pb.StepPlan(
                step_id=2,
                finished_seq_ids=[1],
                new_sequences=[_new(2, prompt, 10, [3, 4, 5]), _new(3, prompt[:5], 5, [6], None)],
            )
        )
    ]
    computed = 10
    while computed < len(prompt):
        n = min(10, len(prompt) - computed)
        results.append(
            runner.execute(
                pb.StepPlan(
                    step_id=len(results) + 2,
                    continuing_sequences=[
                        pb.ContinuingSequence(seq_id=2, num_scheduled_tokens=n),
                        pb.ContinuingSequence(seq_id=3, num_scheduled_tokens=1),
                    ],
                )
            )
        )
        computed += n
    assert not _scored(results, 3)
    return [whole], results


def test_own_forward_scores_the_prompt_as_transformers_does(loaded_model, prompt, expected):
    assert len(prompt) > 20  # three chunks of 10
    whole, chunked = _whole_then_chunked(build_runner(loaded_model), prompt)
    _check(_scored(whole, 1), prompt, expected)
    _check(_scored(chunked, 2), prompt, expected)
    assert len(_scored(chunked, 2)) == -(-len(prompt) // 10)


def test_transformers_modules_score_the_prompt_too(transformers_model, prompt, expected):
    whole, chunked = _whole_then_chunked(build_runner(transformers_model), prompt)
    _check(_scored(whole, 1), prompt, expected)
    _check(_scored(chunked, 2), prompt, expected)


def test_a_plan_asking_for_too_many_alternatives_is_refused(loaded_model, prompt):
    from worker_svc.errors import PlanError

    runner = build_runner(loaded_model)
    with pytest.raises(PlanError, match="prompt_logprobs 21"):
        runner.execute(pb.StepPlan(step_id=1, new_sequences=[_new(1, prompt, 4, [0], 21)]))
