"""A model's block weights gathered into one huge-page buffer (compute/block_arena.py):
the same products, one storage in the step's order, and the advice taken where THP is."""

from __future__ import annotations

import pytest
import torch

from tests.worker.test_huge_pages import thp_takes_advice
from worker_svc.compute.block_arena import RUN_ALIGNMENT, gather_block_weights
from worker_svc.compute.qblock import FORMATS
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_stack import QBlockStack, block_runs
from worker_svc.huge_pages import HUGE_PAGE_BYTES


def _linear(fmt: str, rows: int, k: int, seed: int) -> QBlockLinear:
    weight = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    return QBlockLinear.from_float(weight, FORMATS[fmt])


def _projections() -> list:
    stack = QBlockStack([_linear("Q4_1", 48, 256, 1), _linear("Q8_0", 16, 256, 2)])
    return [_linear("BF16", 40, 256, 3), stack, torch.nn.Linear(4, 4), _linear("Q4_1", 32, 512, 4)]


def test_products_are_unchanged_and_the_runs_share_one_buffer_in_order():
    projections = _projections()
    x = {256: torch.randn(3, 256), 512: torch.randn(3, 512)}
    blocks = [p for p in projections if not isinstance(p, torch.nn.Linear)]
    before = [p(x[p.in_features]) for p in blocks]
    arena, _ = gather_block_weights(projections)
    runs = [run for p in blocks for run in block_runs(p)]
    after = [p(x[p.in_features]) for p in blocks]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    starts = [run.blocks.data_ptr() for run in runs]
    assert all(run.blocks.untyped_storage().data_ptr() == arena.data_ptr() for run in runs)
    # In the order given, each on its own cache line, the first on a huge page boundary.
    assert starts == sorted(starts) and starts[0] % HUGE_PAGE_BYTES == 0
    assert all(start % RUN_ALIGNMENT == 0 for start in starts)
    for run, following in zip(runs[:-1], starts[1:], strict=True):
        assert run.blocks.data_ptr() + run.blocks.numel() <= following


def test_nothing_to_gather_makes_no_buffer():
    assert gather_block_weights([torch.nn.Linear(4, 4)]) == (None, False)


@pytest.mark.model
def test_the_default_models_weights_are_one_buffer_on_huge_pages(q4_1):
    model = q4_1.model
    assert model.block_weights_on_huge_pages is thp_takes_advice()
    projections = [
        getattr(layer, name)
        for layer in model.layers
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    ]
    runs = [run for p in [*projections, model.lm_head] for run in block_runs(p)]
    storages = {run.blocks.untyped_storage().data_ptr() for run in runs}
    assert len(storages) == 1
    starts = [run.blocks.data_ptr() for run in runs]
    assert starts == sorted(starts)  # the native step's order: layer by layer, then the head
