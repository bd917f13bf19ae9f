"""gpt-oss's MXFP4 expert blocks (GGUF type 39) as Q8_0 blocks holding the very same
values.

An MXFP4 block is 32 weights: one E8M0 byte (a power of two, 2^(e - 128) as llama.cpp
halves it) and 16 bytes of 4-bit codes, each one of the sixteen integers
{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}, low nibbles for weights 0-15 and high ones
for 16-31. A Q8_0 block is one float16 scale and 32 int8: with the scale set to the
power of two (exact in float16 from 2^-24 to 2^15) and the codes' integers as the int8,
it dequantizes bit for bit to what MXFP4 does, and the block kernels (their VNNI
path included) multiply by the file's own weights. It reads 34 bytes a block where
MXFP4 reads 17: the price of no MXFP4 kernel yet. A scale outside float16's powers of
two (none in the released models) is refused by name.
"""

from __future__ import annotations

import numpy as np

MXFP4_TYPE = 39
BLOCK = 32
MXFP4_BYTES = 17
# llama.cpp's kvalues_mxfp4: E2M1 values, doubled to integers (the scale is halved).
CODES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def mxfp4_as_q8_0(raw: np.ndarray, rows: int, k: int) -> np.ndarray:
    """`raw` (rows * k / 32 MXFP4 blocks) -> Q8_0 blocks `[rows, k / 32 * 34]` uint8.
    Raises ValueError where a block's scale is outside float16's powers of two."""
    blocks = raw.reshape(-1, MXFP4_BYTES)
    exponent = blocks[:, 0].astype(np.int32) - 128
    nibbles = blocks[:, 1:]
    values = np.empty((len(blocks), BLOCK), dtype=np.int8)
    values[:, :16] = CODES[nibbles & 0x0F]
    values[:, 16:] = CODES[nibbles >> 4]
    # A block of zeros is zero at any scale: only the others need theirs held.
    outside = ((exponent < -24) | (exponent > 15)) & (values != 0).any(axis=1)
    exponent = np.clip(exponent, -24, 15)
    if outside.any():
        # Q8_0's float16 scale cannot hold them, exactly or at all (none in gpt-oss's
        # released files): refused by name rather than computed as zeros or infinities.
        raise ValueError(
            f"{int(outside.sum())} MXFP4 blocks scale by powers of two outside float16's "
            "2^-24 .. 2^15"
        )
    scale = np.ldexp(np.float32(1.0), exponent).astype(np.float16)
    out = np.empty((len(blocks), 2 + BLOCK), dtype=np.uint8)
    out[:, :2] = scale.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = values.view(np.uint8)
    return out.reshape(rows, -1)
