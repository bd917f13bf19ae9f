"""The slot store's per-slot rank and its bfloat16 form (lora/slots.py), on the Python
delta and in the native decode step (kernels/decode_lora.h).

An adapter of rank 8 in a store of max rank 16 must compute what it computes in a store
of max rank 8: the step reads only its own rank's rows of each part, so the native
step's logits are the same to the bit, the Python forward's within a float's rounding.
A bfloat16 store must give the native step the Python forward's logits over that same
store, within the native step's own tolerances."""

from __future__ import annotations

import contextlib

import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker.lora.specs import HIDDEN, INTER, smollm_spec
from tests.worker.lora.test_native_lora import (
    ADAPTERS,
    MIXED,
    _random_adapter,
    assert_native_equals_python,
    run_step,
)
from tests.worker.lora.test_native_lora_kernel import BUILDS, _load
from tests.worker.native_step import prefill, uses_vnni
from worker_svc.lora.delta import attach_slots
from worker_svc.lora.slots import LoraLimits, LoraSlots, store_dtype

model = pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF")


def test_ranks_follow_write_and_clear():
    slots = LoraSlots(smollm_spec(2), LoraLimits(2, 1, 16))
    weights = {(1, "down_proj"): (torch.randn(4, INTER), torch.randn(HIDDEN, 4))}
    slots.write(2, weights, scaling=1.0)
    assert slots.ranks.tolist() == [0, 0, 4] and slots.rank(2) == 4
    mixed = {**weights, (0, "q_proj"): (torch.randn(8, HIDDEN), torch.randn(HIDDEN, 8))}
    with pytest.raises(ValueError, match="one rank"):
        slots.write(1, mixed, scaling=1.0)
    slots.clear(2)
    assert slots.ranks.tolist() == [0, 0, 0] and slots.rank_list == [0, 0, 0]


def test_store_dtype_follows_the_activations():
    assert store_dtype(torch.float32) == torch.float32  # q4_1's blocks compute in float32
    assert store_dtype(torch.bfloat16) == torch.bfloat16
    assert store_dtype(torch.float16) == torch.float32
    f32 = LoraSlots(smollm_spec(1), LoraLimits(1, 1, 8))
    bf16 = LoraSlots(smollm_spec(1), LoraLimits(1, 1, 8), dtype=torch.bfloat16)
    weights = {(0, "up_proj"): (torch.randn(8, HIDDEN), torch.randn(INTER, 8))}
    f32.write(1, weights, scaling=0.5)
    bf16.write(1, weights, scaling=0.5)
    for (a32, b32), (a16, b16) in zip(
        (f32.tensors(0, "gate_up"),), (bf16.tensors(0, "gate_up"),), strict=True
    ):
        assert a16.dtype == b16.dtype == torch.bfloat16
        assert torch.equal(a16, a32.to(torch.bfloat16)) and torch.equal(b16, b32.to(torch.bfloat16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        LoraSlots(smollm_spec(1), LoraLimits(1, 1, 8), dtype=torch.float16)


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize(("rank", "n"), [(16, 32), (8, 37), (5, 13)])
def test_bf16_shrink_and_expand_equal_torch(build, rank, n):
    """The bfloat16 forms widen exactly: they equal the float32 arithmetic on the same
    (rounded) values, with and without AVX-512."""
    lib = _load(BUILDS[build])
    for name in ("lora_shrink_bf16", "lora_expand_bf16"):
        getattr(lib, name).argtypes = getattr(lib, name.removesuffix("_bf16")).argtypes
    gen = torch.Generator().manual_seed(rank + n)
    T, k, width, ldy = 6, 72, 3 * rank, n + 3
    rows = torch.tensor([5, 0, 3], dtype=torch.int64)
    x = torch.randn(T, k, generator=gen)
    a = torch.randn(rank, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(rank, n + 5, generator=gen).to(torch.bfloat16)
    shrunk = torch.full((T, width), float("nan"))
    lib.lora_shrink_bf16(
        a.data_ptr(), rank, k, x.data_ptr(), k, rows.data_ptr(), 3, shrunk.data_ptr(), width
    )
    torch.testing.assert_close(shrunk[rows, :rank], x[rows] @ a.float().T, rtol=1e-5, atol=1e-4)
    y = torch.randn(T, ldy, generator=gen)
    want = y.clone()
    want[rows, :n] += shrunk[rows, :rank] @ b.float()[:, :n]
    lib.lora_expand_bf16(
        b.data_ptr(), n + 5, n, rank, shrunk.data_ptr(), width, rows.data_ptr(), 3,
        y.data_ptr(), ldy,
    )  # fmt: skip
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)


@contextlib.contextmanager
def attached(loaded, slots):
    saved = [layer.lora for layer in loaded.model.layers]
    attach_slots(loaded.model, slots)
    try:
        yield slots
    finally:
        for layer, lora in zip(loaded.model.layers, saved, strict=True):
            layer.lora = lora


def _store(loaded, max_rank, adapters, dtype=torch.float32) -> LoraSlots:
    limits = LoraLimits(max_cpu_loras=4, max_loras=4, max_lora_rank=max_rank)
    slots = LoraSlots(loaded.model.spec, limits, dtype=dtype)
    for slot, (rank, targets, alpha) in adapters.items():
        slots.write(slot, _random_adapter(slots, rank, targets, seed=slot), alpha / rank)
    return slots


@pytest.fixture(scope="module")
def state(q4_1):
    runner = prefill(q4_1)
    return runner.pool.cache.clone(), runner.sequences


@model
@pytest.mark.model
def test_rank8_in_a_max16_store_equals_a_max8_store(q4_1, state):
    rank8 = {slot: spec for slot, spec in ADAPTERS.items() if spec[0] == 8}  # slots 2, 4
    seq_ids, row_slots = [0, 1, 2, 3], [2, 0, 4, 2]
    results = {}
    for max_rank in (16, 8):
        with attached(q4_1, _store(q4_1, max_rank, rank8)) as slots:
            native, _ = run_step(q4_1, state, seq_ids, row_slots, q4_1.model.native_decode)
            python, _ = run_step(q4_1, state, seq_ids, row_slots)
            if max_rank == 16:  # NaN in the padding: the native step must not read it
                for a, b in (slots.tensors(layer, name) for layer, name in slots.shapes):
                    for part in range(a.shape[1] // 16):
                        a[[2, 4], part * 16 + 8 : part * 16 + 16] = float("nan")
                        b[[2, 4], part * 16 + 8 : part * 16 + 16] = float("nan")
                poisoned, _ = run_step(q4_1, state, seq_ids, row_slots, q4_1.model.native_decode)
                assert torch.equal(poisoned, native), "the native step read the padding"
        results[max_rank] = native, python
    assert torch.equal(results[16][0], results[8][0])
    torch.testing.assert_close(results[16][1], results[8][1], rtol=1e-6, atol=1e-5)


@model
@pytest.mark.model
@pytest.mark.parametrize("seq_ids", [[1], list(range(16))], ids=["1-row", "16-rows"])
def test_bf16_store_native_equals_python(q4_1, state, seq_ids):
    row_slots = [1] if len(seq_ids) == 1 else MIXED
    native = q4_1.model.native_decode
    with attached(q4_1, _store(q4_1, 16, ADAPTERS, torch.bfloat16)):
        logits = assert_native_equals_python(
            q4_1, state, seq_ids, row_slots, native, uses_vnni(native, len(seq_ids))
        )
    with attached(q4_1, _store(q4_1, 16, ADAPTERS)):
        f32, _ = run_step(q4_1, state, seq_ids, row_slots, native)
    # A bfloat16 store rounds the adapter: close to the float32 store's, not equal.
    assert not torch.equal(logits, f32)
    torch.testing.assert_close(logits, f32, rtol=0, atol=1e-3 * f32.abs().max().item())
