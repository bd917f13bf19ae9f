"""LoRA adapters in the native decode step (models/qblock/kernels/decode_lora.h) against
the Python forward on the same q4_1 weights and the same slot store (lora/delta.py).

Four adapters of random A and B (never zero B: a missing delta must show), two ranks
under the store's max and two target sets, in slots 1..4; batches of one row and of 16
rows mixing base rows with every slot, from the prefilled state and with the tolerances
of the native step's own tests (tests/worker/native_step.py), on every path this CPU
runs. The base rows of a mixed step are the base step's to the bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.defaults import packaged_gguf_path
from tests.worker.native_step import (
    TOLERANCES,
    Path,
    assert_close_logits,
    batch16_paths,
    decode_step,
    on_path,
    prefill,
    prefilled,
    uses_vnni,
)
from worker_svc.lora.batch import LoraBatch
from worker_svc.lora.delta import attach_slots
from worker_svc.lora.slots import MODULE_PARTS, LoraLimits, LoraSlots

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(packaged_gguf_path() is None, reason="no packaged GGUF"),
]

MAX_RANK = 16
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# slot -> (rank, targets, alpha): both ranks, all seven modules, attention only, a part
# of a fused projection alone (q and v without k), the MLP only.
ADAPTERS = {
    1: (16, ATTENTION + MLP, 32),
    2: (8, ("q_proj", "v_proj"), 16),
    3: (16, ATTENTION, 16),
    4: (8, MLP, 8),
}
SCALE = 0.03
MIXED = [0, 1, 2, 3, 4, 0, 1, 1, 2, 3, 4, 4, 0, 3, 2, 1]  # 16 rows: base and four slots


def _random_adapter(slots: LoraSlots, rank, targets, seed) -> dict:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(slots.num_layers):
        for module in targets:
            name, part = MODULE_PARTS[module]
            shape = slots.shapes[(layer, name)]
            a = torch.randn(rank, shape.in_features, generator=generator) * SCALE
            b = torch.randn(shape.part_sizes[part], rank, generator=generator) * SCALE
            weights[(layer, module)] = (a, b)
    return weights


@pytest.fixture(scope="module")
def adapters(q4_1):
    """Slots 1..4 written and attached to the shared model's layers for the module
    (what the layers held before is restored after)."""
    saved = [layer.lora for layer in q4_1.model.layers]
    limits = LoraLimits(max_cpu_loras=4, max_loras=4, max_lora_rank=MAX_RANK)
    slots = LoraSlots(q4_1.model.spec, limits)
    for slot, (rank, targets, alpha) in ADAPTERS.items():
        slots.write(slot, _random_adapter(slots, rank, targets, seed=slot), alpha / rank)
    attach_slots(q4_1.model, slots)
    yield slots
    for layer, lora in zip(q4_1.model.layers, saved, strict=True):
        layer.lora = lora


@pytest.fixture(scope="module")
def state(q4_1):
    runner = prefill(q4_1)
    return runner.pool.cache.clone(), runner.sequences


def run_step(loaded, state, seq_ids, row_slots, native=None):
    """One decode step of `seq_ids` from the prefilled state, row i on slot row_slots[i]
    (None: no LoraBatch), by `native` or else the Python forward: logits and the pool."""
    runner = prefilled(loaded, state)
    ids, positions, context = decode_step(runner, seq_ids)
    if row_slots is not None:
        lora = LoraBatch.from_row_slots(torch.tensor(row_slots, dtype=torch.int32))
        context = dataclasses.replace(context, lora=lora)
    rows = torch.arange(len(seq_ids))
    with torch.inference_mode():
        if native is not None:
            return native(ids, positions, context, rows), runner.pool.cache
        model = loaded.model
        saved, model.native_decode = model.native_decode, None
        try:
            return model(ids, positions, context, rows), runner.pool.cache
        finally:
            model.native_decode = saved


def assert_native_equals_python(loaded, state, seq_ids, row_slots, native, vnni):
    py_logits, py_cache = run_step(loaded, state, seq_ids, row_slots)
    nat_logits, nat_cache = run_step(loaded, state, seq_ids, row_slots, native)
    assert nat_logits is not None, "the native step declined a step with adapter rows"
    assert_close_logits(nat_logits, py_logits, vnni)
    torch.testing.assert_close(nat_cache, py_cache, rtol=0, atol=TOLERANCES[vnni][1])
    return nat_logits


@pytest.mark.parametrize("slot", sorted(ADAPTERS))
def test_one_row_on_each_adapter(q4_1, adapters, state, slot):
    native = q4_1.model.native_decode
    logits = assert_native_equals_python(q4_1, state, [1], [slot], native, uses_vnni(native, 1))
    base, _ = run_step(q4_1, state, [1], None, native)
    # The adapter moves the logits far more than the two paths differ.
    assert (logits - base).abs().max() > 100 * TOLERANCES[False][0] * base.abs().max()


@pytest.mark.parametrize("path", batch16_paths())
def test_16_rows_mixing_base_and_four_adapters(q4_1, adapters, state, path):
    with on_path(q4_1.model, path) as native:
        assert uses_vnni(native, 16) == path.vnni
        assert_native_equals_python(q4_1, state, list(range(16)), MIXED, native, path.vnni)


@pytest.mark.parametrize("path", batch16_paths())
def test_base_rows_of_a_mixed_step_are_the_base_steps(q4_1, adapters, state, path):
    with on_path(q4_1.model, path) as native:
        mixed, _ = run_step(q4_1, state, list(range(16)), MIXED, native)
        base, _ = run_step(q4_1, state, list(range(16)), None, native)
    on_base = torch.tensor(MIXED) == 0
    assert torch.equal(mixed[on_base], base[on_base])
    assert not torch.allclose(mixed[~on_base], base[~on_base], rtol=1e-3, atol=0)


def test_greedy_tokens_equal_over_steps(q4_1, adapters, state):
    """Four decode steps of three sequences on slots 1, 0 and 4, each path feeding its
    own greedy tokens back: the same tokens."""
    seq_ids, row_slots = [0, 1, 2], [1, 0, 4]

    def greedy(native) -> list[list[int]]:
        runner = prefilled(q4_1, state)
        steps = []
        for _ in range(4):
            ids, positions, context = decode_step(runner, seq_ids)
            lora = LoraBatch.from_row_slots(torch.tensor(row_slots, dtype=torch.int32))
            context = dataclasses.replace(context, lora=lora)
            with torch.inference_mode():
                logits = (native or q4_1.model)(ids, positions, context, torch.arange(3))
            tokens = logits.argmax(-1).tolist()
            for seq_id, token in zip(seq_ids, tokens, strict=True):
                seq = runner.sequences[seq_id]
                seq.num_computed_tokens += 1
                seq.token_ids.append(token)
            steps.append(tokens)
        return steps

    native_tokens = greedy(q4_1.model.native_decode)
    saved, q4_1.model.native_decode = q4_1.model.native_decode, None
    try:
        python_tokens = greedy(None)
    finally:
        q4_1.model.native_decode = saved
    assert native_tokens == python_tokens


def test_a_slot_outside_the_store_is_refused(q4_1, adapters, state):
    with pytest.raises(RuntimeError, match="unsupported shape"):
        run_step(q4_1, state, [0, 1], [0, adapters.num_slots], q4_1.model.native_decode)


def test_every_kernel_variant_at_three_rows(q4_1, adapters, state):
    """Float activations on each block-kernel variant, rows on two adapters and the base."""
    from worker_svc.compute.qblock import supported_variants

    for variant in supported_variants():
        with on_path(q4_1.model, Path(variant, vnni=False)) as native:
            assert_native_equals_python(q4_1, state, [0, 1, 2], [2, 0, 1], native, False)
