"""gpt-oss's attention sinks and o_proj bias in the native decode step
(models/qblock/kernels/decode_attention.h, decode_step.c) on a long context, where a
team of 4 threads splits each (token, kv head) item's keys into parts merged afterwards:
the sink must join exactly one part's softmax sum. Against the Python forward over a
float32 and a float16 pool, split (4 threads) and whole (1); and with the step's sink or
bias table emptied, the logits move (so the random checkpoint's sinks and biases count
and the tables are what the step reads)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.worker.architectures.test_block_path import CLOSE
from tests.worker.architectures.test_float_forward import CPU, prompt
from tests.worker.native_step import team_of
from worker_svc.attention import BatchLayout, CpuAttentionBackend, PagedAttentionContext
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import load_model
from worker_svc.models.qblock.native import NativeDecode

pytestmark = pytest.mark.model

BLOCK = 16
# 2 kv heads, one sequence: 2 items. With 4 threads, parts = min(ceil(8 / 2), 300 // 64) =
# 4 runs of 80 keys on the full layers; on the sliding layers (8 keys) parts 1-3 are empty.
CONTEXT = 300
DECODES = 3


@pytest.fixture(scope="module")
def gpt_oss(checkpoints):
    own = load_model(checkpoints["gpt_oss"], "q4_1", CPU)
    assert own.model.native_decode_status == "native decode steps"
    return own


def decode_logits(own, kv_dtype, native_step) -> torch.Tensor:
    """CONTEXT - DECODES prompt tokens prefilled by the Python forward, then DECODES decode
    steps by `native_step` (None: the Python forward); the decodes' logits."""
    spec = KVPoolSpec(own.num_layers, own.num_kv_heads, own.head_dim, BLOCK, kv_dtype)
    pool, backend = KVPool(spec, CONTEXT // BLOCK + 2), CpuAttentionBackend()
    table = tuple(range(CONTEXT // BLOCK + 1))
    model = copy.copy(own.model)
    model.native_decode = None
    ids = prompt(11, CONTEXT)

    def step(start: int, end: int) -> torch.Tensor:
        layout = BatchLayout((end - start,), (end,), (table,), BLOCK)
        context = PagedAttentionContext(backend, pool, backend.build_metadata(layout, CPU))
        rows = torch.arange(end - start)
        return model(ids[start:end], torch.arange(start, end), context, rows)

    prefill = CONTEXT - DECODES
    with torch.inference_mode():
        step(0, prefill)
        model.native_decode = native_step
        return torch.cat([step(i, i + 1) for i in range(prefill, CONTEXT)])


def counted(step, ran: list):
    def call(*args):
        out = step(*args)
        ran.append(out is not None)
        return out

    return call


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["kv32", "kv16"])
@pytest.mark.parametrize("threads", [4, 1], ids=["split", "whole"])
def test_a_long_context_with_sinks_equals_the_python_forward(gpt_oss, kv_dtype, threads):
    ran: list = []
    with team_of(threads):
        want = decode_logits(gpt_oss, kv_dtype, None)
        got = decode_logits(gpt_oss, kv_dtype, counted(NativeDecode(gpt_oss.model), ran))
    assert ran == [True] * DECODES
    torch.testing.assert_close(got, want, **CLOSE)


@pytest.mark.parametrize("table", ["sinks", "o_biases"])
def test_the_step_reads_the_sinks_and_the_o_proj_bias(gpt_oss, table):
    want = decode_logits(gpt_oss, torch.float32, None)
    step = NativeDecode(gpt_oss.model)
    getattr(step._layers, table).zero_()  # the structure holds the table's address
    got = decode_logits(gpt_oss, torch.float32, step)
    assert (got - want).abs().max() > 100 * CLOSE["atol"]
