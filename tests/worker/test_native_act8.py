"""8-bit activation blocks (compute/qblock_vnni8.py) on chosen projection kinds: the native
decode step computes what the Python forward computes with them, and they are in use
(the logits move from the 16-bit kernel's) only where QBlockLinear.act8 is set."""

from __future__ import annotations

import contextlib

import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker.native_step import Path, on_path, prefill, python_and_native
from worker_svc.compute.qblock_linear import VNNI_FROM_M
from worker_svc.compute.qblock_vnni8 import act8_kinds, enable_act8, load_vnni8_kernel
from worker_svc.models.qblock.native_structs import BlockWeight

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
    pytest.mark.skipif(load_vnni8_kernel() is None, reason="no AVX-512 VNNI here"),
]
VNNI = Path("auto", vnni=True)
KINDS = ("qkv_proj", "gate_up_proj")
LOGITS_RTOL = 4e-2  # measured 1.5e-2 (test_logits_close_to_the_python_forwards says why)


@contextlib.contextmanager
def act8_on(model, names=KINDS):
    projections = [getattr(layer, name) for layer in model.layers for name in names]
    try:
        assert all(enable_act8(p) for p in projections)
        yield
    finally:
        for projection in projections:
            projection.act8 = False


@pytest.fixture(scope="module")
def prefilled_state(q4_1):
    runner = prefill(q4_1)
    return runner.pool.cache.clone(), runner.sequences


def step(q4_1, state, seq_ids):
    """Logits and the pool after one decode of `seq_ids` on the VNNI path, by the Python
    forward and the native step; each call needs its own seq_ids (the Python step is
    cached by them, native_step._PYTHON_STEPS)."""
    rows = torch.arange(len(seq_ids))
    with on_path(q4_1.model, VNNI) as native:
        before, python, ours = python_and_native(q4_1, state, native, seq_ids, rows, VNNI)
    return before, python, ours


def test_layer_0_kv_equal_the_python_forwards(q4_1, prefilled_state):
    """Layer 0's K/V come from qkv_proj's 8-bit blocks of the normed embedding: both forwards
    quantize the same values (but where the norms' last bits move a block's scale or put
    a value on a level's edge: measured 82% of them bit-identical on Zen 4),
    so the native step's K/V equal the Python forward's, and not the 16-bit kernel's."""
    seq_ids = list(range(16))
    assert len(seq_ids) >= VNNI_FROM_M
    _, _, (_, kv16) = step(q4_1, prefilled_state, seq_ids)
    with act8_on(q4_1.model, ("qkv_proj",)):
        before, (_, py8), (_, nat8) = step(q4_1, prefilled_state, seq_ids[1:] + seq_ids[:1])
    written = py8[0] != before[0]
    assert torch.equal(nat8[0] != before[0], written)
    assert (nat8[0][written] == py8[0][written]).float().mean() >= 0.7  # measured 82%
    assert (nat8[0][written] == kv16[0][written]).float().mean() <= 0.2


def test_logits_close_to_the_python_forwards(q4_1, prefilled_state):
    """Through 30 layers a last-bit difference moves an 8-bit activation a level (2**-7 of
    its block's largest): measured on Zen 4, a 1-ulp change of 10% of gate_up's inputs
    moves the logits by 1.2% of the largest, the two forwards differ by 1.3-1.5%. A wiring
    error (a missing term, a wrong scale) moves them by their own size."""
    seq_ids = list(range(16))
    with act8_on(q4_1.model):
        _, (py8, _), (nat8, _) = step(q4_1, prefilled_state, seq_ids[::-1])
    assert (nat8 - py8).abs().max() / py8.abs().max() < LOGITS_RTOL
    assert (nat8.argmax(-1) == py8.argmax(-1)).float().mean() >= 0.75


def test_block_weight_carries_the_flag_only_where_set(q4_1):
    layer = q4_1.model.layers[0]
    with act8_on(q4_1.model, ("gate_up_proj",)):
        assert BlockWeight.of(layer.gate_up_proj).act8 == 1
        assert BlockWeight.of(layer.down_proj).act8 == 0
    assert BlockWeight.of(layer.gate_up_proj).act8 == 0
    assert BlockWeight.of(q4_1.model.lm_head).act8 == 0  # Q8_0: not the kernel's
    assert not enable_act8(q4_1.model.lm_head)


def test_kinds_from_the_environment(monkeypatch):
    monkeypatch.setenv("CBSERVE_QBLOCK_ACT8", "qkv, gate_up")
    assert act8_kinds() == {"qkv", "gate_up"}
    assert act8_kinds("off") == frozenset()
    with pytest.raises(ValueError, match="lm_head"):
        act8_kinds("qkv,lm_head")
