"""--model-impl null in process: plans answered as the protocol says, after the simulated
step time, with ids from the given vocabulary (no tokenizer, no model, no torch op)."""

from __future__ import annotations

import time

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.config import WorkerConfig
from worker_svc.errors import PlanError
from worker_svc.kv_pool import KVPoolSpec
from worker_svc.null.runner import NullModel, NullRunner, StepTimeModel
from worker_svc.null.sampler import NullSampler, NullVocabulary, ordinary_token_ids
from worker_svc.null.worker import NullKVPool

VOCAB = tuple(range(100, 140))
EOS = 2
SAMPLING = pb.SequenceSampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0)


def make_runner(
    step_ms: float = 0.0, us_per_token: float = 0.0, eos_probability: float = 0.0
) -> NullRunner:
    model = NullModel("tiny", vocab_size=200, max_model_len=256, num_layers=2,
                      num_kv_heads=1, head_dim=4)  # fmt: skip
    spec = KVPoolSpec(num_layers=2, num_kv_heads=1, head_dim=4, block_size=4, dtype=torch.float32)
    vocabulary = NullVocabulary(VOCAB, eos_token_id=EOS, eos_probability=eos_probability)
    return NullRunner(
        model, NullKVPool(spec, 64), NullSampler(vocabulary), StepTimeModel(step_ms, us_per_token)
    )


def new_seq(seq_id: int, prompt_len: int, blocks: list[int], **sampling) -> pb.NewSequence:
    return pb.NewSequence(
        seq_id=seq_id,
        prompt_token_ids=list(range(10, 10 + prompt_len)),
        num_scheduled_tokens=prompt_len,
        block_ids=blocks,
        sampling=pb.SequenceSampling(**{**_fields(SAMPLING), **sampling}),
    )


def _fields(message) -> dict:
    return {f.name: v for f, v in message.ListFields()}


def decode(step_id: int, *seq_ids: int, num_steps: int = 1, new_blocks=()) -> pb.StepPlan:
    continuing = [
        pb.ContinuingSequence(seq_id=s, num_scheduled_tokens=1, new_block_ids=list(new_blocks))
        for s in seq_ids
    ]
    return pb.StepPlan(step_id=step_id, continuing_sequences=continuing, num_steps=num_steps)


def test_prefill_then_decode_samples_vocabulary_ids_and_tracks_state():
    runner = make_runner()
    result = runner.execute(
        pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 5, [0, 1]), new_seq(2, 3, [2])])
    )
    assert result.step_id == 1 and sorted(result.seq_ids) == [1, 2]
    assert result.num_tokens == 8 and all(t in VOCAB for t in result.token_ids)
    assert not result.logprobs
    result = runner.execute(decode(2, 1, 2))
    assert result.num_tokens == 2 and len(result.token_ids) == 2
    assert runner.sequences[1].num_computed_tokens == 6 and runner.sequences[1].num_tokens == 7
    # Finished ids are dropped before the step; the other keeps decoding.
    result = runner.execute(pb.StepPlan(step_id=3, finished_seq_ids=[2], continuing_sequences=[
        pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1)]))  # fmt: skip
    assert list(result.seq_ids) == [1] and set(runner.sequences) == {1}


def test_middle_prefill_chunk_samples_nothing():
    runner = make_runner()
    chunk = new_seq(1, 8, [0, 1])
    chunk.num_scheduled_tokens = 4
    result = runner.execute(pb.StepPlan(step_id=1, new_sequences=[chunk]))
    assert result.num_tokens == 4 and not result.seq_ids and not result.token_ids
    result = runner.execute(pb.StepPlan(step_id=2, continuing_sequences=[
        pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=4)]))  # fmt: skip
    assert list(result.seq_ids) == [1] and len(result.token_ids) == 1


def test_multi_step_plan_is_step_major():
    runner = make_runner()
    runner.execute(
        pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [0, 1]), new_seq(2, 3, [2, 3])])
    )
    result = runner.execute(decode(2, 1, 2, num_steps=3))
    assert list(result.seq_ids) == [1, 2] and len(result.token_ids) == 6
    assert result.num_tokens == 6
    for index, seq_id in enumerate((1, 2)):
        seq = runner.sequences[seq_id]
        # The prompt, the prefill's token and three more; all but the last computed.
        assert seq.num_tokens == 3 + 1 + 3 and seq.num_computed_tokens == 6
        assert seq.token_ids[4:] == list(result.token_ids[index::2])


def test_recompute_and_prefix_hit_continue_where_the_sequence_was():
    # Seeded: the token after a recompute is the one the first run drew at that index.
    first = make_runner()
    first.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 4, [0, 1], seed=3)]))
    first.execute(decode(2, 1))
    drawn = first.sequences[1].token_ids[4:]
    again = make_runner()
    recompute = new_seq(1, 4, [0, 1], seed=3)
    recompute.output_token_ids.append(drawn[0])
    recompute.num_scheduled_tokens = 5
    result = again.execute(pb.StepPlan(step_id=1, new_sequences=[recompute]))
    assert list(result.token_ids) == drawn[1:] and result.num_tokens == 5
    # A prefix-cache hit computes only the rest of the prompt.
    hit = new_seq(2, 6, [2, 3])
    hit.num_computed_tokens, hit.num_scheduled_tokens = 4, 2
    result = again.execute(pb.StepPlan(step_id=2, new_sequences=[hit], continuing_sequences=[
        pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=1)]))  # fmt: skip
    assert sorted(result.seq_ids) == [1, 2] and result.num_tokens == 3
    assert again.sequences[2].num_computed_tokens == 6


def test_logprobs_are_plausible():
    runner = make_runner()
    result = runner.execute(
        pb.StepPlan(
            step_id=1, new_sequences=[new_seq(1, 3, [0], num_logprobs=3), new_seq(2, 3, [1])]
        )
    )
    (logprobs,) = result.logprobs
    row = list(result.seq_ids).index(1)
    assert logprobs.index == row
    assert logprobs.top_token_ids[0] == result.token_ids[row]
    assert len(set(logprobs.top_token_ids)) == 3
    assert logprobs.logprob == logprobs.top_logprobs[0] <= 0
    assert list(logprobs.top_logprobs) == sorted(logprobs.top_logprobs, reverse=True)
    assert sum(2.718281828**v for v in logprobs.top_logprobs) < 1


def test_seeded_rows_repeat_and_eos_waits_for_min_tokens():
    tokens = []
    for _ in range(2):
        runner = make_runner()
        runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [0, 1], seed=7)]))
        for step in range(2, 6):
            runner.execute(decode(step, 1))
        tokens.append(runner.sequences[1].token_ids[3:])
    assert tokens[0] == tokens[1] and len(tokens[0]) == 5
    runner = make_runner(eos_probability=1.0)
    result = runner.execute(pb.StepPlan(step_id=1, new_sequences=[
        new_seq(1, 3, [0], min_tokens=2, max_tokens=8), new_seq(2, 3, [1])]))  # fmt: skip
    by_seq = dict(zip(result.seq_ids, result.token_ids, strict=True))
    assert by_seq[1] != EOS and by_seq[2] == EOS


def test_invalid_plan_is_refused_and_changes_nothing():
    runner = make_runner()
    runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 3, [0])]))
    with pytest.raises(PlanError, match="unknown sequence 9"):
        runner.execute(decode(2, 1, 9))
    with pytest.raises(PlanError, match="out of range"):
        runner.execute(pb.StepPlan(step_id=3, new_sequences=[new_seq(2, 3, [64])]))
    assert set(runner.sequences) == {1} and runner.sequences[1].num_computed_tokens == 3


def test_step_time_is_fixed_part_plus_per_token_part():
    assert StepTimeModel(10, 50).seconds(100) == pytest.approx(0.015)
    runner = make_runner(step_ms=20, us_per_token=1000)
    started = time.perf_counter()
    result = runner.execute(pb.StepPlan(step_id=1, new_sequences=[new_seq(1, 10, [0, 1, 2])]))
    elapsed = time.perf_counter() - started
    assert 0.030 <= result.forward_seconds <= elapsed < 0.2
    # A multi-step plan pays the fixed part once per step.
    started = time.perf_counter()
    result = runner.execute(decode(2, 1, num_steps=2))
    assert 0.042 <= result.forward_seconds <= time.perf_counter() - started


def test_ordinary_token_ids_leave_out_special_byte_and_blank_tokens():
    class Tokenizer:
        all_special_ids = [0]
        pieces = ["<s>", " the", "\ufffd", "  ", "ing", "\n"]

        def __len__(self):
            return len(self.pieces)

        def batch_decode(self, ids):
            return [self.pieces[i] for (i,) in ids]

    assert ordinary_token_ids(Tokenizer()) == (1, 4)


def test_null_flags_need_the_null_model_and_sane_values():
    assert WorkerConfig(model="m", model_impl="null", null_step_ms=10).null_step_ms == 10
    with pytest.raises(ValueError, match="null_step_ms needs model_impl null"):
        WorkerConfig(model="m", null_step_ms=10)
    with pytest.raises(ValueError, match="null_step_us_per_token must be a finite"):
        WorkerConfig(model="m", model_impl="null", null_step_us_per_token=-1)
    with pytest.raises(ValueError, match="at most 1"):
        WorkerConfig(model="m", model_impl="null", null_eos_probability=1.5)
    with pytest.raises(ValueError, match="compile"):
        WorkerConfig(model="m", model_impl="null", compile=True)


def test_prompt_logprobs_come_slice_by_slice_in_the_protocols_shape():
    runner = make_runner()
    first = new_seq(1, 10, [0, 1, 2])
    first.num_scheduled_tokens = 4
    first.prompt_logprobs = 2
    chunks = [runner.execute(pb.StepPlan(step_id=1, new_sequences=[first]))]
    for step_id, n in ((2, 4), (3, 2)):
        chunks.append(
            runner.execute(
                pb.StepPlan(
                    step_id=step_id,
                    continuing_sequences=[pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=n)],
                )
            )
        )
    # Positions 0-3, 4-7 and 8-9 computed: tokens 1-4, 5-8 and 9 scored.
    slices = [[(p.first_position, len(p.logprobs)) for p in c.prompt_logprobs] for c in chunks]
    assert slices == [[(1, 4)], [(5, 4)], [(9, 1)]]
    last = chunks[-1].prompt_logprobs[0]
    assert last.num_top == 2 and len(last.top_token_ids) == len(last.top_logprobs) == 2
    assert last.top_token_ids[0] == 10 + 9  # the prompt token, made the most likely
    assert list(chunks[-1].seq_ids) == [1] and not chunks[0].seq_ids
