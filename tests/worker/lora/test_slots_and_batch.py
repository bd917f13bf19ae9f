"""The slot store's layout and a step's rows by adapter (no weights: the fast tier)."""

from __future__ import annotations

import pytest
import torch

from tests.worker.lora.specs import HEAD_DIM, HIDDEN, INTER, KV_HEADS, NUM_LAYERS, smollm_spec
from worker_svc.config import WorkerConfig
from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.delta import add_lora_delta
from worker_svc.lora.slots import LoraLimits, LoraSlots

Q, KV = 9 * HEAD_DIM, KV_HEADS * HEAD_DIM


def test_limits_are_validated():
    assert LoraLimits(max_cpu_loras=4, max_loras=2, max_lora_rank=8).max_loras == 2
    with pytest.raises(ValueError, match="max_cpu_loras .* at least max_loras"):
        LoraLimits(max_cpu_loras=1, max_loras=2, max_lora_rank=8)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_lora_rank"):
            LoraLimits(max_cpu_loras=1, max_loras=1, max_lora_rank=bad)


def test_worker_flags_default_and_check():
    assert WorkerConfig().lora_limits is None  # without --enable-lora
    limits = WorkerConfig(enable_lora=True, max_loras=2).lora_limits
    assert limits == LoraLimits(max_cpu_loras=2, max_loras=2, max_lora_rank=16)
    assert WorkerConfig(enable_lora=True, max_cpu_loras=4).lora_limits.max_cpu_loras == 4
    with pytest.raises(ValueError, match="max_cpu_loras"):
        WorkerConfig(enable_lora=True, max_loras=3, max_cpu_loras=2)
    with pytest.raises(ValueError, match="own forward"):
        WorkerConfig(enable_lora=True, model_impl="transformers")


def test_store_shapes_and_base_slot():
    slots = LoraSlots(smollm_spec(), LoraLimits(3, 2, 16))
    assert slots.num_slots == 4 and slots.num_layers == NUM_LAYERS
    a, b = slots.tensors(0, "qkv")
    assert a.shape == (4, 3 * 16, HIDDEN) and b.shape == (4, 3 * 16, Q + 2 * KV)
    assert a.dtype == b.dtype == torch.float32 and a.is_contiguous() and b.is_contiguous()
    assert slots.shapes[(0, "qkv")].part_sizes == (Q, KV, KV)
    a, b = slots.tensors(NUM_LAYERS - 1, "gate_up")
    assert a.shape == (4, 2 * 16, HIDDEN) and b.shape == (4, 2 * 16, 2 * INTER)
    assert slots.tensors(3, "down")[0].shape == (4, 16, INTER)
    assert slots.tensors(3, "o")[1].shape == (4, 16, HIDDEN)
    with pytest.raises(ValueError, match="out of range"):
        slots.check_slot(0)  # the base is never written
    with pytest.raises(ValueError, match="out of range"):
        slots.check_slot(4)


def test_mixture_layers_have_no_mlp_slots():
    slots = LoraSlots(smollm_spec(4, sparse_layers=frozenset({1, 3})), LoraLimits(1, 1, 8))
    assert slots.has(0, "gate_up") and slots.has(0, "down")
    assert not slots.has(1, "gate_up") and not slots.has(3, "down")
    assert slots.has(1, "qkv") and slots.has(1, "o")


def test_write_places_parts_block_diagonally_and_folds_the_scaling():
    slots = LoraSlots(smollm_spec(2), LoraLimits(2, 1, 8))
    gen = torch.Generator().manual_seed(0)
    lora_a = {m: torch.randn(4, HIDDEN, generator=gen) for m in ("k_proj", "up_proj")}
    lora_b = {"k_proj": torch.randn(KV, 4, generator=gen), "up_proj": torch.randn(INTER, 4)}
    weights = {(1, m): (lora_a[m], lora_b[m]) for m in lora_a}
    slots.write(2, weights, scaling=0.5)
    assert slots.loaded == {2: ("k_proj", "up_proj")}
    x = torch.randn(5, HIDDEN, generator=gen)
    for fused, module, offset in (("qkv", "k_proj", Q), ("gate_up", "up_proj", INTER)):
        a, b = slots.tensors(1, fused)
        out = torch.zeros(5, b.shape[2])
        add_lora_delta(out, x, (a, b), LoraBatch.from_sequences([(2, 5)]))
        want = torch.zeros_like(out)
        size = lora_b[module].shape[0]
        want[:, offset : offset + size] = 0.5 * (x @ lora_a[module].T) @ lora_b[module].T
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        assert not slots.tensors(0, fused)[0].any() and not slots.tensors(0, fused)[1].any()
    assert not slots.tensors(1, "qkv")[0][1].any(), "slot 1 was never written"
    slots.clear(2)
    assert not slots.loaded and not slots.tensors(1, "qkv")[1][2].any()


def test_batch_groups_rows_by_slot_in_batch_order():
    batch = LoraBatch.from_sequences([(0, 2), (3, 1), (1, 4), (3, 2)])
    assert batch.row_slots.dtype == torch.int32 and batch.row_slots.is_contiguous()
    assert batch.row_slots.tolist() == [0, 0, 3, 1, 1, 1, 1, 3, 3]
    assert [(slot, rows.tolist()) for slot, rows in batch.groups] == [
        (1, [3, 4, 5, 6]),
        (3, [2, 7, 8]),
    ]
    assert batch.groups[0][1].dtype == torch.int64
    assert batch.slots == (1, 3) and not batch.is_empty
    kept = batch.kept(torch.tensor([1, 6, 8]))
    assert kept.row_slots.tolist() == [0, 1, 3]
    assert [(slot, rows.tolist()) for slot, rows in kept.groups] == [(1, [1]), (3, [2])]


def test_base_rows_only_is_empty_and_adds_nothing():
    batch = LoraBatch.from_sequences([(0, 3), (0, 1)])
    assert batch.is_empty and batch.num_rows == 4 and batch.row_slots.tolist() == [0] * 4
    assert batch.kept(torch.tensor([3])).is_empty
    a, b = torch.ones(2, 4, 3), torch.ones(2, 5, 4)
    out = torch.zeros(4, 5)
    add_lora_delta(out, torch.ones(4, 3), (a, b), batch)
    assert not out.any()
