"""gpt-oss's MXFP4 expert blocks as Q8_0 blocks of the same values
(worker_svc/models/qblock/mxfp4.py), against the `gguf` package's own MXFP4 dequantizer
(llama.cpp's reference rule)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker_svc.compute.qblock import Q8_0, dequantize
from worker_svc.models.qblock.mxfp4 import MXFP4_BYTES, mxfp4_as_q8_0


def reference(raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    import gguf

    kind = gguf.GGMLQuantizationType.MXFP4
    return np.asarray(gguf.quants.dequantize(raw.reshape(rows, -1), kind), np.float32).reshape(
        rows, k
    )


def mxfp4_blocks(rows: int, k: int, exponents: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * k // 32, MXFP4_BYTES), dtype=np.uint8)
    blocks[:, 0] = rng.integers(*exponents, size=len(blocks))
    return blocks.reshape(-1)


def test_every_code_and_scale_float16_holds_is_exact():
    rows, k = 48, 256
    raw = mxfp4_blocks(rows, k, (128 - 24, 128 + 16), seed=1)
    blocks = mxfp4_as_q8_0(raw, rows, k)
    assert blocks.shape == (rows, k // 32 * 34)
    got = dequantize(torch.from_numpy(blocks), Q8_0).numpy()
    assert np.array_equal(got, reference(raw, rows, k))


@pytest.mark.parametrize("exponents", [(128 - 40, 128 - 30), (128 + 16, 128 + 20)])
def test_a_scale_float16_cannot_hold_is_refused_by_name(exponents):
    raw = mxfp4_blocks(4, 64, exponents, seed=2)
    with pytest.raises(ValueError, match="outside float16"):
        mxfp4_as_q8_0(raw, 4, 64)
