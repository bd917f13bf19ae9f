"""Speculative steps on the real model: a decode that verifies the worker's own n-gram
drafts emits exactly the tokens plain decodes emit (greedy, seeded, with penalties and
with logprobs), in fewer steps where drafts are found, on the Python forward and on
the native decode step; the worker refuses drafts where they cannot be verified."""

from __future__ import annotations

import pytest

from cbserve.worker.v1 import worker_pb2 as pb
from tests.worker.conftest import build_runner
from worker_svc.errors import PlanError

pytestmark = pytest.mark.model

BLOCK_SIZE = 16
NEW_TOKENS = 24
SAMPLINGS = [
    pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0, num_logprobs=2),
    pb.SequenceSampling(temperature=0.8, top_p=0.95, repetition_penalty=1.0, seed=11),
    pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.2, presence_penalty=0.3),
]
# Prompts whose answers repeat what they hold, so that drafts are found and accepted.
PROMPTS = [
    "Copy this list exactly.\napple, banana, cherry, date, elderberry, fig, grape\n"
    "apple, banana, cherry, date, elderberry, fig, grape\napple, banana,",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef add(",
    "one two three four five six seven eight nine ten\none two three four five",
]
LOOKUP = pb.NgramLookup(min_n=1, max_n=3)


def generate(runner, tokenizer, drafts: int, samplings=SAMPLINGS):
    """Prefills the prompts, then decodes until each has NEW_TOKENS tokens; returns the
    tokens, the logprob entries (token, top ids) of sequence 1 and the decode plans
    each sequence took."""
    plan = pb.StepPlan(step_id=1)
    free = iter(range(runner.pool.num_blocks))
    for seq_id, (text, sampling) in enumerate(zip(PROMPTS, samplings, strict=True), start=1):
        ids = tokenizer(text)["input_ids"]
        blocks = [next(free) for _ in range(-(-(len(ids) + NEW_TOKENS + 8) // BLOCK_SIZE))]
        plan.new_sequences.add(
            seq_id=seq_id,
            prompt_token_ids=ids,
            num_scheduled_tokens=len(ids),
            block_ids=blocks,
            sampling=sampling,
        )
    result = runner.execute(plan)
    tokens = {s: [t] for s, t in zip(result.seq_ids, result.token_ids, strict=True)}
    logprobs = []
    plans = dict.fromkeys(tokens, 0)
    step_id = 1
    while min(len(t) for t in tokens.values()) < NEW_TOKENS:
        step_id += 1
        step = pb.StepPlan(step_id=step_id, ngram_lookup=LOOKUP if drafts else None)
        for seq_id, seq_tokens in tokens.items():
            if len(seq_tokens) < NEW_TOKENS:  # no draft past NEW_TOKENS: blocks end there
                plans[seq_id] += 1
                room = min(drafts, NEW_TOKENS - len(seq_tokens))
                step.continuing_sequences.add(
                    seq_id=seq_id, num_scheduled_tokens=1, num_draft_tokens=room
                )
        result = runner.execute(step)
        counts = list(result.token_counts) or [1] * len(result.seq_ids)
        at = 0
        for seq_id, count in zip(result.seq_ids, counts, strict=True):
            tokens[seq_id].extend(result.token_ids[at : at + count])
            at += count
        assert at == len(result.token_ids)
        for entry in result.logprobs:
            logprobs.append((result.token_ids[entry.index], list(entry.top_token_ids)))
    return {s: t[:NEW_TOKENS] for s, t in tokens.items()}, logprobs, plans


# The Python forward's variant is slow (15 s): `make test-slow` runs it; the native
# step is the default path's.
@pytest.mark.parametrize("path", [pytest.param("python", marks=pytest.mark.slow), "native"])
def test_drafts_emit_the_tokens_plain_decodes_emit(path, loaded_model, q4_1, tokenizer):
    loaded = loaded_model if path == "python" else q4_1
    plain, plain_logprobs, plain_plans = generate(
        build_runner(loaded, num_blocks=24), tokenizer, drafts=0
    )
    spec, spec_logprobs, spec_plans = generate(
        build_runner(loaded, num_blocks=24), tokenizer, drafts=4
    )
    assert spec == plain
    # Logprobs for sequence 1's every token, as plain decodes give them.
    assert spec_logprobs[: len(plain_logprobs)] == plain_logprobs[: len(spec_logprobs)]
    # The prompts repeat themselves: drafts were accepted, so the greedy and the seeded
    # sequence took fewer steps (the penalised one avoids repeating).
    assert spec_plans[1] < plain_plans[1] and spec_plans[2] < plain_plans[2], spec_plans


def test_the_result_counts_drafts_and_the_state_keeps_only_accepted_tokens(make_runner, tokenizer):
    runner = make_runner(num_blocks=24, block_size=BLOCK_SIZE)
    ids = tokenizer(PROMPTS[2])["input_ids"]
    runner.execute(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=ids,
                    num_scheduled_tokens=len(ids),
                    block_ids=[0, 1, 2],
                    sampling=SAMPLINGS[0],
                )
            ],
        )
    )
    seq = runner.sequences[1]
    before = seq.num_tokens
    result = runner.execute(
        pb.StepPlan(
            step_id=2,
            ngram_lookup=LOOKUP,
            continuing_sequences=[
                pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1, num_draft_tokens=5)
            ],
        )
    )
    (count,), (drafts,) = result.token_counts, result.draft_counts
    assert drafts == 5  # "six seven eight nine ten" follows "five" earlier
    assert 1 <= count <= drafts + 1 and len(result.token_ids) == count
    assert result.num_tokens == 1 + drafts
    assert seq.num_tokens == before + count
    # The last emitted token is not computed yet; rejected drafts' KV is not counted.
    assert seq.num_computed_tokens == seq.num_tokens - 1


def test_drafts_are_refused_where_they_cannot_be_verified(make_runner, tokenizer):
    runner = make_runner(num_blocks=8, block_size=BLOCK_SIZE)
    runner.execute(
        pb.StepPlan(
            step_id=1,
            new_sequences=[
                pb.NewSequence(
                    seq_id=1,
                    prompt_token_ids=list(range(1, 15)),
                    num_scheduled_tokens=14,
                    block_ids=[0],
                    sampling=SAMPLINGS[0],
                )
            ],
        )
    )

    def plan(new_block_ids=(1,), **fields):
        sequence = pb.ContinuingSequence(
            seq_id=1, num_scheduled_tokens=1, num_draft_tokens=4, new_block_ids=new_block_ids
        )
        return pb.StepPlan(step_id=2, continuing_sequences=[sequence], **fields)

    # 15 tokens + 4 drafts need 2 blocks of 16: the sequence holds one.
    with pytest.raises(PlanError, match="cannot hold 19 tokens"):
        runner.execute(plan(new_block_ids=(), ngram_lookup=LOOKUP))
    with pytest.raises(PlanError, match="ngram_lookup"):
        runner.execute(plan())
    with pytest.raises(PlanError, match="one-step plan"):
        runner.execute(plan(ngram_lookup=LOOKUP, num_steps=2))
    # A constrained sequence's rows past its first follow drafts: no more than its room.
    row = b"\xff" * 4 * -(-runner.reader.vocab_size // 32)
    masked = pb.TokenBitmask(
        seq_ids=[1], words=row * 6, row_counts=[6], draft_token_ids=[1, 2, 3, 4, 5]
    )
    with pytest.raises(PlanError, match="may verify 4 drafts"):
        runner.execute(plan(ngram_lookup=LOOKUP, allowed_tokens=masked))
    miscounted = pb.TokenBitmask(seq_ids=[1], words=row * 3, row_counts=[3], draft_token_ids=[1])
    with pytest.raises(PlanError, match="draft_token_ids"):
        runner.execute(plan(ngram_lookup=LOOKUP, allowed_tokens=miscounted))
    assert runner.sequences[1].num_tokens == 15  # nothing changed


def test_the_row_cost_is_measured_on_the_runner_and_leaves_it_empty(q4_1):
    from worker_svc.speculation.row_cost import measure_draft_row_cost

    runner = build_runner(q4_1, num_blocks=16)
    cost = measure_draft_row_cost(runner, drafts=4, repeats=3)
    print(f"draft row cost on q4_1: {cost:.4f} of a one-row step")
    assert 0.0 <= cost < 5.0  # a share of a step, not seconds
    assert runner.sequences == {}
    # A pool too small for the scratch sequence: not measured, and nothing run.
    assert measure_draft_row_cost(build_runner(q4_1, num_blocks=2)) == 0.0
