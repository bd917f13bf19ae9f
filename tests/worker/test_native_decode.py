"""The q4_1 path's native decode step (models/qblock/native.py) against the Python forward
it replaces: logits, the K/V it writes into the pool, and greedy tokens in the runner.

Contexts of 5, 37 and 70 tokens in blocks of 16 tokens (one, three and five blocks, each
sequence's blocks scattered over the pool), and 13 more of 12 tokens for a batch of 16:
from the CPU's VNNI threshold (compute/measured.py), where it has AVX-512 VNNI, both paths
quantize the activations to 16-bit blocks for integer dot products."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from cbserve.worker.v1 import worker_pb2 as pb
from common.defaults import default_model_path, packaged_gguf_path
from tests.worker.conftest import build_runner
from worker_svc.attention import BatchLayout, PagedAttentionContext
from worker_svc.compute.qblock import supported_variants
from worker_svc.compute.qblock_linear import VNNI_FROM_M, QBlockLinear
from worker_svc.models.qblock.build import attach_native_decode
from worker_svc.models.qblock.native import NativeDecode, native_decode_disabled_reason

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

GREEDY = pb.SequenceSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)
CONTEXTS = (70, 5, 37, *(12,) * 13)
BLOCK_SIZE = 16
# The native step sums the norms in another order than torch. With float activations
# (measured: 4e-7 of the largest logit, 6e-6 absolute on K/V whose largest is about 20)
# that is all; with 16-bit activation blocks a last-bit difference in a norm's output
# can round an activation to its neighbouring level (measured: 9e-5 and 1.5e-3, the
# size of the VNNI path's own distance from float activations, 1.2e-4 and 2.4e-3).
TOLERANCES = {False: (1e-5, 1e-4), True: (5e-4, 1e-2)}  # by VNNI: logits rtol, KV atol


def prefill(loaded, contexts=CONTEXTS, seed=0, kv_dtype=None):
    """A runner whose sequences have computed their prompts and sampled one token each,
    over a pool of `kv_dtype` (default the model's: float32)."""
    runner = build_runner(loaded, num_blocks=64, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
    rng = random.Random(seed)
    free = list(range(runner.pool.num_blocks))
    rng.shuffle(free)
    plan = pb.StepPlan()
    for seq_id, context in enumerate(contexts):
        tokens = [rng.randrange(100, 40000) for _ in range(context - 1)]
        blocks = [free.pop() for _ in range(-(-(context + 16) // BLOCK_SIZE))]
        new = pb.NewSequence(
            seq_id=seq_id,
            prompt_token_ids=tokens,
            num_scheduled_tokens=len(tokens),
            block_ids=blocks,
            sampling=GREEDY,
        )
        plan.new_sequences.append(new)
    runner.execute(plan)
    return runner


@pytest.fixture(scope="module")
def prefilled_state(q4_1):
    """The prefilled runner's pool and sequences, computed once for the module."""
    runner = prefill(q4_1)
    return runner.pool.cache.clone(), runner.sequences


def prefilled(loaded, state):
    """A fresh runner in the prefilled state."""
    cache, sequences = state
    runner = build_runner(loaded, num_blocks=64, block_size=BLOCK_SIZE, kv_dtype=cache.dtype)
    runner.pool.cache.copy_(cache)
    runner.sequences = copy.deepcopy(sequences)
    return runner


def decode_step(runner, seq_ids):
    """The model's inputs for one decode of each sequence, as the runner builds them."""
    seqs = [runner.sequences[i] for i in seq_ids]
    layout = BatchLayout(
        query_lens=(1,) * len(seqs),
        context_lens=tuple(s.num_computed_tokens + 1 for s in seqs),
        block_tables=tuple(tuple(s.block_ids) for s in seqs),
        block_size=BLOCK_SIZE,
    )
    context = PagedAttentionContext(
        runner.backend, runner.pool, runner.backend.build_metadata(layout, torch.device("cpu"))
    )
    ids = torch.tensor([s.token_ids[s.num_computed_tokens] for s in seqs])
    positions = torch.tensor([s.num_computed_tokens for s in seqs])
    return ids, positions, context


_PYTHON_STEPS: dict = {}  # (seq_ids, rows, pool dtype) -> the Python forward's logits, pool


def python_and_native(loaded, state, native, seq_ids, sample_rows):
    """The pool before a step, then logits and the pool after it, by the Python forward
    (computed once per batch for the module) and by `native`, each from that pool."""
    runner = prefilled(loaded, state)
    ids, positions, context = decode_step(runner, seq_ids)
    before = runner.pool.cache.clone()
    key = (tuple(seq_ids), tuple(sample_rows.tolist()), before.dtype)
    if key not in _PYTHON_STEPS:
        model = loaded.model
        saved, model.native_decode = model.native_decode, None
        try:
            with torch.inference_mode():
                logits = model(ids, positions, context, sample_rows)
        finally:
            model.native_decode = saved
        _PYTHON_STEPS[key] = logits, runner.pool.cache.clone()
        runner.pool.cache.copy_(before)
    with torch.inference_mode():
        native_logits = native(ids, positions, context, sample_rows)
    return before, _PYTHON_STEPS[key], (native_logits, runner.pool.cache)


def uses_vnni(native, rows):
    return native.vnni_from_m > 0 and rows >= native.vnni_from_m


def assert_close_logits(native, python, vnni=False, rtol=None):
    assert native.shape == python.shape
    error = (native - python).abs().max() / python.abs().max()
    assert error < (rtol or TOLERANCES[vnni][0]), f"relative error {error:.2e}"
    assert torch.equal(native.argmax(-1), python.argmax(-1))


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


def test_batch16_on_the_vnni_kernel_in_both_paths(q4_1, prefilled_state):
    """Where this CPU's measured threshold keeps 16 rows on the float kernel (Ice Lake:
    VNNI from 256), both paths are put on VNNI from 16 rows, so that the native step's
    VNNI branch is checked against the Python forward's on every CPU that has it."""
    projections = [m for m in q4_1.model.modules() if isinstance(m, QBlockLinear)]
    if not projections[0].vnni:
        pytest.skip("no AVX-512 VNNI kernel here")
    saved = [p.vnni_from_m for p in projections]
    seq_ids, rows = list(range(16)), torch.arange(16)
    key = (tuple(seq_ids), tuple(rows.tolist()), torch.float32)
    _PYTHON_STEPS.pop(key, None)
    try:
        for projection in projections:
            projection.vnni_from_m = VNNI_FROM_M
        native = NativeDecode(q4_1.model)
        assert native.vnni_from_m == VNNI_FROM_M == 16
        before, (py_logits, py_cache), (nat_logits, nat_cache) = python_and_native(
            q4_1, prefilled_state, native, seq_ids, rows
        )
        assert_close_logits(nat_logits, py_logits, vnni=True)
        torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[True][1])
    finally:
        for projection, threshold in zip(projections, saved, strict=True):
            projection.vnni_from_m = threshold
        _PYTHON_STEPS.pop(key, None)


# The default schedule is dynamic: every variant runs with it, and AUTO with static.
@pytest.mark.parametrize(
    ("variant", "schedule"),
    [*((v, "dynamic") for v in supported_variants()), ("auto", "static")],
)
def test_every_kernel_variant_and_schedule(q4_1, prefilled_state, variant, schedule):
    native = NativeDecode(q4_1.model, variant=variant, schedule=schedule)
    _, (py_logits, _), (nat_logits, _) = python_and_native(
        q4_1, prefilled_state, native, [0, 1, 2], torch.arange(3)
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
    assert counting.ran == 15  # every step after the prefill
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
