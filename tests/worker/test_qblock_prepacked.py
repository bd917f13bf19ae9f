"""The VNNI kernel's panels packed once at load (compute/qblock_prepacked.py): the
prepacked gemm, QBlockLinear and the native decode step compute bit for bit what the
per-call packing computes."""

from __future__ import annotations

import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker.native_step import CONTEXTS, Path, decode_step, on_path, prefill, prefilled
from worker_svc.compute.qblock import MXFP4, Q4_1, Q4_K, Q8_0, load_vnni_kernel, vnni_matmul
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_prepacked import (
    PREPACK_ENV,
    prepacked_bytes,
    vnni_prepack,
    vnni_prepacked_matmul,
)
from worker_svc.compute.qblock_stack import block_runs
from worker_svc.models.qblock.native_structs import BlockWeight

pytestmark = pytest.mark.skipif(load_vnni_kernel() is None, reason="no AVX-512 VNNI here")
SHAPES = ((40, 96), (3072, 576))  # N not a multiple of 16, and the default model's gate_up


def random_blocks(fmt, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Blocks of `fmt` for a weight [n, k]: quantized from random floats (Q4_1, Q8_0),
    or random bytes whose scales are set in range (MXFP4: an E8M0 exponent a block)."""
    generator = torch.Generator().manual_seed(seed)
    if fmt is not MXFP4:
        return QBlockLinear.from_float(torch.randn(n, k, generator=generator) * 0.05, fmt).blocks
    blocks = torch.randint(0, 256, (n, k // 32, 17), dtype=torch.uint8, generator=generator)
    blocks[..., 0] = torch.randint(118, 130, (n, k // 32), dtype=torch.uint8, generator=generator)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0, MXFP4], ids=lambda f: f.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_prepacked_gemm_equals_per_call_packing(fmt, shape):
    n, k = shape
    blocks = random_blocks(fmt, n, k)
    panels, scales = vnni_prepack(blocks, fmt, k)
    assert panels.numel() * 2 + scales.numel() * 4 == prepacked_bytes(n, k)
    for m in (16, 17, 64):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        expected = vnni_matmul(x, blocks, fmt, k)
        assert expected.abs().max() > 0
        assert torch.equal(vnni_prepacked_matmul(x, panels, scales, n, k), expected)


def test_missing_rows_of_the_last_panel_are_zero():
    panels, scales = vnni_prepack(random_blocks(Q4_1, 40, 96), Q4_1, 96)
    assert panels.shape == (3, 48, 16, 2) and scales.shape == (3, 2, 3, 16)
    assert not panels[2, :, 8:].any() and not scales[2, :, :, 8:].any()
    assert panels[2, :, :8].any() and scales[2, 0, :, :8].all()


def test_formats_packed_at_every_call_are_refused():
    with pytest.raises(ValueError, match="Q4_K"):
        vnni_prepack(torch.zeros(16, 144, dtype=torch.uint8), Q4_K, 256)


@pytest.mark.parametrize("fmt", [Q4_1, Q8_0, MXFP4], ids=lambda f: f.name)
def test_qblock_linear_with_and_without_prepacking(fmt, monkeypatch):
    n, k = 40, 96
    blocks = random_blocks(fmt, n, k, seed=1)
    on = QBlockLinear(blocks, fmt, k, vnni_from_m=16, dense_from_m=None)
    monkeypatch.setenv(PREPACK_ENV, "0")
    off = QBlockLinear(blocks, fmt, k, vnni_from_m=16, dense_from_m=None)
    unasked = QBlockLinear(blocks, fmt, k, vnni_from_m=16, prepack=False)
    assert on.vnni_panels is not None and on.vnni_scales is not None
    assert off.vnni_panels is None and unasked.vnni_panels is None
    for m in (16, 17, 64):
        x = torch.randn(m, k)
        assert torch.equal(on(x), off(x))


def test_block_weight_carries_the_panels_only_where_packed():
    blocks = random_blocks(Q4_1, 40, 96)
    packed = BlockWeight.of(QBlockLinear(blocks, Q4_1, 96, vnni_from_m=16))
    assert packed.vnni_panels[0] and packed.vnni_scales[0]
    unpacked = BlockWeight.of(QBlockLinear(blocks, Q4_1, 96, vnni_from_m=16, prepack=False))
    assert not unpacked.vnni_panels[0] and not unpacked.vnni_scales[0]


VNNI = Path("auto", vnni=True)


@pytest.mark.model
@pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF")
def test_native_step_with_and_without_prepacked_panels(q4_1):
    """One decode of 16 sequences on the VNNI path: the native step reading the panels
    packed at load writes the same K/V and logits, bit for bit, as the one packing them
    at every call; and it does read them: with the LM head's (Q8_0) panels zeroed, every
    logit is zero."""
    model = q4_1.model
    runs = [run for p in model.modules() if isinstance(p, QBlockLinear) for run in block_runs(p)]
    assert any(run.vnni_panels is not None for run in runs)
    state = prefill(q4_1)
    state = (state.pool.cache.clone(), state.sequences)
    seq_ids = list(range(len(CONTEXTS)))
    assert len(seq_ids) >= 16
    outputs = []
    saved = [(run, run.vnni_panels, run.vnni_scales) for run in runs]
    try:
        with on_path(model, VNNI) as packed_at_load:
            for run, _, _ in saved:
                run.vnni_panels = run.vnni_scales = None
            with on_path(model, VNNI) as packed_per_call:
                head = model.lm_head
                _, head_panels, head_scales = next(entry for entry in saved if entry[0] is head)
                head.vnni_panels, head.vnni_scales = torch.zeros_like(head_panels), head_scales
                zeroed_head = type(packed_at_load)(model)
                for native in (packed_at_load, packed_per_call, zeroed_head):
                    runner = prefilled(q4_1, state)
                    ids, positions, context = decode_step(runner, seq_ids)
                    with torch.inference_mode():
                        logits = native(ids, positions, context, torch.arange(len(seq_ids)))
                    outputs.append((logits, runner.pool.cache.clone()))
    finally:
        for run, panels, scales in saved:
            run.vnni_panels, run.vnni_scales = panels, scales
    (logits_a, kv_a), (logits_b, kv_b), (logits_c, _) = outputs
    assert packed_at_load.vnni_from_m and len(seq_ids) >= packed_at_load.vnni_from_m
    assert torch.equal(logits_a, logits_b)
    assert torch.equal(kv_a, kv_b)
    assert logits_a.abs().max() > 0 and not logits_c.any()
