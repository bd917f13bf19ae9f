"""Prompts through the native step (step/flat_batch.py's prefill_rows): a runner on the
q4_1 path lays prompt chunks out as decode rows, so a step with prompts in it is one
native call. Against the same plans run with the prompts as prefill chunks (the Python
forward): the same tokens sampled, and K/V within the native step's own bounds
(native_step.TOLERANCES). A prompt split in two chunks (the second over the first's
K/V in the pool) and a sequence decoding beside a chunk are in the plans."""

from __future__ import annotations

import random

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import packaged_gguf_path
from tests.worker.conftest import build_runner
from tests.worker.native_step import GREEDY, TOLERANCES, uses_vnni
from tests.worker.test_native_decode import _Counting

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

BLOCK_SIZE = 16
# seq 0: a whole 40-token prompt; seq 1: a 70-token prompt in chunks of 32 and 38.
PROMPT_LENS = (40, 70)
FIRST_CHUNK = 32


def _plans() -> list[pb.StepPlan]:
    rng = random.Random(5)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in PROMPT_LENS]
    first = pb.StepPlan(step_id=0)
    for seq_id, (prompt, scheduled) in enumerate(zip(prompts, (40, FIRST_CHUNK), strict=True)):
        first.new_sequences.append(
            pb.NewSequence(
                seq_id=seq_id,
                prompt_token_ids=prompt,
                num_scheduled_tokens=scheduled,
                block_ids=range(seq_id * 8, seq_id * 8 + 8),
                sampling=GREEDY,
            )
        )
    second = pb.StepPlan(
        step_id=1,
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=0, num_scheduled_tokens=1),
            pb.ContinuingSequence(seq_id=1, num_scheduled_tokens=PROMPT_LENS[1] - FIRST_CHUNK),
        ],
    )
    third = pb.StepPlan(
        step_id=2,
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=seq_id, num_scheduled_tokens=1) for seq_id in (0, 1)
        ],
    )
    return [first, second, third]


def _run(q4_1, prefill_rows: bool, kv_dtype):
    runner = build_runner(q4_1, num_blocks=16, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
    runner.prefill_rows = prefill_rows
    model = q4_1.model
    counting = _Counting(model.native_decode)
    model.native_decode = counting
    try:
        tokens = [list(runner.execute(plan).token_ids) for plan in _plans()]
    finally:
        model.native_decode = counting.native
    return tokens, runner.pool.cache.clone(), counting.ran


@pytest.mark.parametrize("kv_dtype", [None, torch.float16], ids=["kv32", "kv16"])
def test_prompts_as_rows_sample_what_prefill_chunks_do(q4_1, kv_dtype):
    rows_tokens, rows_cache, rows_native = _run(q4_1, True, kv_dtype)
    chunk_tokens, chunk_cache, chunk_native = _run(q4_1, False, kv_dtype)
    assert rows_native == 3  # every step, the prompts' included
    assert chunk_native == 1  # only the last, with no prompt in it
    assert rows_tokens == chunk_tokens
    assert [len(t) for t in rows_tokens] == [1, 2, 2]
    # Every slot a prompt wrote; the steps' bounds are those of the rows' arithmetic.
    vnni = uses_vnni(q4_1.model.native_decode, FIRST_CHUNK)
    rtol = 2**-10 if rows_cache.dtype == torch.float16 else 0
    torch.testing.assert_close(rows_cache, chunk_cache, rtol=rtol, atol=TOLERANCES[vnni][1])
