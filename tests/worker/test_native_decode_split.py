"""The native decode step's split attention (models/qblock/kernels/decode_attention.h):
with fewer (token, kv head) items than about two a thread, each item's keys are cut into
parts attended apart and merged. One sequence of SmolLM2 (3 kv heads) with a long context,
on a team of 4 threads (so the split happens whatever cores the machine has: 3 items,
parts of at least 64 keys) and of 1 (no split), against the Python forward, over a
float32 and a float16 pool, with and without drafts' rows of the same sequence."""

from __future__ import annotations

import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker.native_step import (
    TOLERANCES,
    assert_close_logits,
    prefill,
    python_and_native,
    team_of,
    uses_vnni,
)

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

# 330 keys: with 4 threads, parts = min(ceil(8 / 3), 330 // 64) = 3, of 7 blocks each.
LONG_CONTEXT = 330


@pytest.fixture(scope="module", params=[None, torch.float16], ids=["kv32", "kv16"])
def long_state(q4_1, request):
    runner = prefill(q4_1, contexts=(LONG_CONTEXT, 9), kv_dtype=request.param)
    return runner.pool.cache.clone(), runner.sequences


@pytest.mark.parametrize("threads", [4, 1], ids=["split", "whole"])
def test_one_long_sequence_equals_the_python_forward(q4_1, long_state, threads):
    with team_of(threads):
        before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
            q4_1, long_state, q4_1.model.native_decode, [0], torch.arange(1)
        )
    vnni = uses_vnni(q4_1.model.native_decode, 1)
    assert_close_logits(nat_logits, py_logits, vnni)
    assert torch.equal(nat_cache != before, py_cache != before)
    # A float16 pool: a last-bit difference upstream can round a value to the next
    # binary16 (the whole step's own bound, test_native_decode_kv16.py): one unit of it.
    rtol = 2**-10 if nat_cache.dtype == torch.float16 else 0
    torch.testing.assert_close(nat_cache, py_cache, rtol=rtol, atol=TOLERANCES[vnni][1])


def test_split_and_whole_agree_on_a_short_and_a_long_sequence(q4_1, long_state):
    """Two items' contexts far apart (9 and 330 keys): the short one's later parts are
    empty, and the merge must skip them."""
    logits = {}
    for threads in (4, 1):
        with team_of(threads):
            _, _, (nat_logits, _) = python_and_native(
                q4_1, long_state, q4_1.model.native_decode, [0, 1], torch.arange(2)
            )
        logits[threads] = nat_logits
    error = (logits[4] - logits[1]).abs().max() / logits[1].abs().max()
    assert error < 1e-5, f"relative error {error:.2e}"
    assert torch.equal(logits[4].argmax(-1), logits[1].argmax(-1))
