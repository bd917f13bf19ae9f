"""The q4_1 path's native decode step (models/qblock/native.py) against the Python forward
it replaces: logits, the K/V it writes into the pool, and greedy tokens in the runner.

Contexts of 5, 37 and 70 tokens in blocks of 16 tokens (one, three and five blocks, each
sequence's blocks scattered over the pool), and 13 more of 12 tokens for a batch of 16:
from the CPU's VNNI threshold (compute/measured.py), where it has AVX-512 VNNI, both paths
quantize the activations to 16-bit blocks for integer dot products; a batch of 16 is
also run on every path this CPU has (tests/worker/native_step.py says why)."""

from __future__ import annotations

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path, packaged_gguf_path
from tests.worker.native_step import (
    BLOCK_SIZE,
    CONTEXTS,
    TOLERANCES,
    Path,
    assert_close_logits,
    batch16_paths,
    on_path,
    prefill,
    prefilled,
    python_and_native,
    uses_vnni,
)
from worker_svc.attention import BatchLayout, PagedAttentionContext
from worker_svc.compute.qblock import supported_variants
from worker_svc.models.qblock.build import attach_native_decode
from worker_svc.models.qblock.native import SCHEDULES, native_decode_disabled_reason

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]


@pytest.fixture(scope="module")
def prefilled_state(q4_1):
    """The prefilled runner's pool and sequences, computed once for the module."""
    runner = prefill(q4_1)
    return runner.pool.cache.clone(), runner.sequences


@pytest.mark.parametrize(
    "seq_ids", [[1], [0, 1, 2], list(range(16))], ids=["batch1", "batch3", "batch16"]
)
def test_logits_and_kv_equal_the_python_forwards(q4_1, prefilled_state, seq_ids):
    rows = torch.arange(len(seq_ids))
    native = q4_1.model.native_decode
    before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
        q4_1, prefilled_state, native, seq_ids, rows
    )
    vnni = uses_vnni(native, len(seq_ids))
    assert_close_logits(nat_logits, py_logits, vnni)
    written = py_cache != before
    # Every layer's K and V of each new token, and nothing else.
    shape = q4_1.model.spec
    assert int(written.sum()) == len(seq_ids) * shape.num_layers * 2 * shape.num_kv_heads * 64
    assert torch.equal(nat_cache != before, written)
    torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[vnni][1])


@pytest.mark.parametrize("path", batch16_paths())
def test_batch16_on_every_path(q4_1, prefilled_state, path):
    """Whatever this CPU's threshold picks for 16 rows (Ice Lake: float up to 256; Zen 4:
    VNNI from 16), both forwards on each path it runs: float activations on every kernel
    variant, and the VNNI kernel where the CPU has it."""
    seq_ids, rows = list(range(16)), torch.arange(16)
    with on_path(q4_1.model, path) as native:
        assert uses_vnni(native, 16) == path.vnni
        before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
            q4_1, prefilled_state, native, seq_ids, rows, path
        )
    assert_close_logits(nat_logits, py_logits, vnni=path.vnni)
    assert torch.equal(nat_cache != before, py_cache != before)
    torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[path.vnni][1])


# The default schedule is dynamic: every variant runs with it, and AUTO with static.
@pytest.mark.parametrize(
    ("variant", "schedule"),
    [*((v, "dynamic") for v in supported_variants()), ("auto", "static")],
)
def test_every_kernel_variant_and_schedule(q4_1, prefilled_state, variant, schedule):
    """The Python forward on the same variant: the step is measured against the
    arithmetic it runs, not against the best variant's (float activations: 3 rows)."""
    path = Path(variant, vnni=False)
    with on_path(q4_1.model, path) as native:
        native.schedule = SCHEDULES[schedule]
        _, (py_logits, _), (nat_logits, _) = python_and_native(
            q4_1, prefilled_state, native, [0, 1, 2], torch.arange(3), path
        )
    assert_close_logits(nat_logits, py_logits)


def test_logits_only_for_the_rows_asked(q4_1, prefilled_state):
    rows = torch.tensor([2, 0])
    _, (py_logits, _), (nat_logits, _) = python_and_native(
        q4_1, prefilled_state, q4_1.model.native_decode, [0, 1, 2], rows
    )
    assert nat_logits.shape[0] == 2
    assert_close_logits(nat_logits, py_logits)


def test_a_step_with_a_prefill_takes_the_python_path(q4_1, prefilled_state):
    runner = prefilled(q4_1, prefilled_state)
    layout = BatchLayout((1, 3), (20, 3), ((0, 1), (2,)), BLOCK_SIZE)
    context = PagedAttentionContext(
        runner.backend, runner.pool, runner.backend.build_metadata(layout, torch.device("cpu"))
    )
    ids, positions = torch.tensor([5, 6, 7, 8]), torch.tensor([19, 0, 1, 2])
    assert q4_1.model.native_decode(ids, positions, context, torch.tensor([0, 3])) is None


def greedy_tokens(loaded, state, steps):
    runner = prefilled(loaded, state)
    plan = pb.StepPlan(
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=i, num_scheduled_tokens=1) for i in range(len(CONTEXTS))
        ],
        num_steps=steps,
    )
    return list(runner.execute(plan).token_ids)


STEPS = 6


def greedy_native_and_python(q4_1, prefilled, steps: int) -> tuple[list[int], list[int]]:
    """The greedy tokens of a multi-step decode from the same state, native steps, then
    the Python forward (the native step detached for the second run)."""
    native = greedy_tokens(q4_1, prefilled, steps)
    saved, q4_1.model.native_decode = q4_1.model.native_decode, None
    try:
        python = greedy_tokens(q4_1, prefilled, steps)
    finally:
        q4_1.model.native_decode = saved
    return native, python


def test_greedy_tokens_equal_over_a_multi_step_decode(q4_1, prefilled_state):
    native, python = greedy_native_and_python(q4_1, prefilled_state, STEPS)
    assert len(native) == STEPS * len(CONTEXTS) and native == python


def test_turned_off_by_the_environment(q4_1, monkeypatch):
    monkeypatch.setenv("CBSERVE_NATIVE_DECODE", "0")
    assert native_decode_disabled_reason() == "CBSERVE_NATIVE_DECODE=0"
    model = q4_1.model
    saved = model.native_decode
    try:
        attach_native_decode(model)
        assert model.native_decode is None
        assert model.native_decode_status == "off: CBSERVE_NATIVE_DECODE=0"
    finally:
        model.native_decode, model.native_decode_status = saved, "native decode steps"


class _Counting:
    """A native step that counts the steps it ran."""

    def __init__(self, native):
        self.native, self.ran = native, 0

    def __call__(self, *args):
        logits = self.native(*args)
        self.ran += logits is not None
        return logits


def test_chat_reply_equals_float32s(q4_1, loaded_model):
    """End to end through the runner: the README's question, greedy, 16 tokens."""
    from bench.accuracy.eval import greedy_replies
    from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer

    tok = Tokenizer(default_model_path())
    prompt = [tok.encode_chat([ChatTurn("user", "What is the capital of France?")])]
    expected = greedy_replies(loaded_model, prompt, 16)
    counting = _Counting(q4_1.model.native_decode)
    q4_1.model.native_decode = counting
    try:
        reply = greedy_replies(q4_1, prompt, 16)
    finally:
        q4_1.model.native_decode = counting.native
    assert counting.ran == 16  # the prompt's step (its tokens as decode rows) and each after
    assert reply == expected and "Paris" in tok.decode(reply[0])


def test_without_the_kernel_the_python_forward_runs(q4_1, monkeypatch):
    import worker_svc.models.qblock.native as llama_native

    def unavailable():
        raise llama_native.KernelUnavailableError("no C compiler (test)")

    monkeypatch.setattr(llama_native, "load_decode_kernel", unavailable)
    model = q4_1.model
    saved = model.native_decode
    try:
        attach_native_decode(model)
        assert model.native_decode is None
        assert model.native_decode_status == "off: no C compiler (test)"
    finally:
        model.native_decode, model.native_decode_status = saved, "native decode steps"
