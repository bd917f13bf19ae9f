"""Test helpers for the K-quant block formats: random blocks with valid scales, numpy
writers of Q4_K and Q6_K (gguf-py can read them but not write them), and a GGUF with a
mix of formats per tensor made from the shipped model's weights, as a Q4_K_M file mixes
them. The writers are simple (one pass of min/max per sub-block, not llama.cpp's search):
what the tests need is a valid file of those formats, not the best quantization."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from bench.micro.qblock_formats import random_blocks  # noqa: F401  (re-exported)
from bench.peers.gguf_rewrite import rewrite_gguf_tensors

QTYPE = gguf.GGMLQuantizationType


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K % 256 == 0) -> Q4_K blocks [N, K / 256 * 144]."""
    n, k = w.shape
    sub = w.reshape(n, k // 256, 8, 32).astype(np.float32)
    lo = np.minimum(sub.min(axis=-1), 0.0)
    scale, mins = (sub.max(axis=-1) - lo) / 15, -lo
    d = (scale.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    dmin = (mins.max(axis=-1, keepdims=True) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d)), 0, 63).astype(np.uint8)
        mn = np.clip(np.nan_to_num(np.rint(mins / dmin)), 0, 63).astype(np.uint8)
        ds, dm = d * sc, dmin * mn
        q = np.nan_to_num(np.rint((sub + dm[..., None]) / ds[..., None]))
    q = np.clip(q, 0, 15).astype(np.uint8)
    packed = np.empty((n, k // 256, 12), dtype=np.uint8)
    packed[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(n, k // 256, 128)
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=-1)
    return out.reshape(n, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K % 256 == 0) -> Q6_K blocks [N, K / 256 * 210]."""
    n, k = w.shape
    sub = w.reshape(n, k // 256, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(axis=-1) / 31
    d = (scale.max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d)), 0, 127).astype(np.int8)
        ds = d * sc.astype(np.float32)
        q = np.nan_to_num(np.rint(sub / ds[..., None]))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, k // 256, 2, 128)
    ql = (q[..., :64] & 15) | ((q[..., 64:] & 15) << 4)  # [.., 2 halves, 64]
    hi = q >> 4
    qh = hi[..., 0:32] | (hi[..., 32:64] << 2) | (hi[..., 64:96] << 4) | (hi[..., 96:128] << 6)
    out = np.concatenate(
        [ql.reshape(n, -1, 128), qh.reshape(n, -1, 64), sc.view(np.uint8), _f16_bytes(d)],
        axis=-1,
    )
    return out.reshape(n, -1)


WRITERS: dict[QTYPE, Callable[[np.ndarray], np.ndarray]] = {
    QTYPE.Q4_K: quantize_q4_k,
    QTYPE.Q6_K: quantize_q6_k,
    QTYPE.Q5_0: lambda w: gguf.quants.quantize(w, QTYPE.Q5_0),
    QTYPE.Q8_0: lambda w: gguf.quants.quantize(w, QTYPE.Q8_0),
    QTYPE.MXFP4: lambda w: gguf.quants.quantize(w, QTYPE.MXFP4),  # gpt-oss's experts
}


def rewrite_gguf(source: Path, target: Path, choose: Callable[[str, int], QTYPE | None]) -> None:
    """`source` copied to `target` with each tensor that `choose(name, K)` names requantized
    (from its dequantized values) to that type; metadata and other tensors as they are."""

    def requantize(tensor: gguf.ReaderTensor) -> tuple[np.ndarray, QTYPE] | None:
        k = int(tensor.shape[0])
        qtype = choose(tensor.name, k) if tensor.tensor_type != QTYPE.F32 else None
        if qtype is None:
            return None
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1, k)
        # The tensor's outer dimensions kept (a 3-D `*_exps` tensor stays 3-D).
        return WRITERS[qtype](weight).reshape(*tensor.data.shape[:-1], -1), qtype

    rewrite_gguf_tensors(source, target, requantize)
