"""Greedy runs of one path against the float32 reference, judged as vLLM judges
quantized models (`check_logprobs_close`): the two token streams are equal up to
their first divergence, and at that position each side's token is among the other
side's top logprobs. Past a divergence the two continue from different text, so
nothing after it is compared."""

from __future__ import annotations

from dataclasses import dataclass

from bench.accuracy.eval import greedy_batch_plans
from worker_svc.model_runner import ModelRunner

TOP = 5


@dataclass
class GreedyRun:
    token_ids: list[int]
    # Per generated position: the top-TOP token ids by logprob.
    top_ids: list[list[int]]


def greedy_runs(runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> list[GreedyRun]:
    """All prompts in one batch, as the scheduler would run them: one prefill step for
    all, then one decode step each for the rest."""
    per_seq = -(-(max(map(len, prompts)) + max_tokens) // runner.pool.block_size)
    runs = [GreedyRun([], []) for _ in prompts]
    plan, decode = greedy_batch_plans(prompts, per_seq, num_logprobs=TOP)
    for step in range(max_tokens):
        result = runner.execute(plan if step == 0 else decode)
        for entry in result.logprobs:
            sid = result.seq_ids[entry.index]
            runs[sid].token_ids.append(result.token_ids[entry.index])
            runs[sid].top_ids.append(list(entry.top_token_ids))
    runner.reset()
    return runs


def check_logprobs_close(reference: list[GreedyRun], tested: list[GreedyRun]) -> list[int | None]:
    """Raises AssertionError naming the prompt and position where the two are not close;
    returns each prompt's first divergence (None where the streams are equal)."""
    divergences: list[int | None] = []
    for index, (ref, got) in enumerate(zip(reference, tested, strict=True)):
        assert len(ref.token_ids) == len(got.token_ids), f"prompt {index}: lengths differ"
        pairs = enumerate(zip(ref.token_ids, got.token_ids, strict=True))
        first = next((pos for pos, (a, b) in pairs if a != b), None)
        divergences.append(first)
        if first is None:
            continue
        ref_token, got_token = ref.token_ids[first], got.token_ids[first]
        assert got_token in ref.top_ids[first], (
            f"prompt {index}, token {first}: {got_token} is not in the reference's top-{TOP} "
            f"{ref.top_ids[first]}"
        )
        assert ref_token in got.top_ids[first], (
            f"prompt {index}, token {first}: the reference's {ref_token} is not in the tested "
            f"path's top-{TOP} {got.top_ids[first]}"
        )
    return divergences
