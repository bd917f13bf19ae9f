/* Plain C dequantizers of the K-quant formats and Q5_0 (layouts: qblock_kquants.h).
 * They are the reference the AVX-512 code is tested against, and the plain and AVX2
 * variants' path at every M: a panel's rows are dequantized here into the thread's
 * buffer and multiplied by qblock_tiles.c's float tiles. Built with -ffp-contract=off,
 * so ds * q - dm rounds once, after an exact product, as numpy's does. */
#include <stdint.h>

#include "qblock_kquants.h"

enum { QK_K = 256, Q4_K_BYTES = 144, Q5_K_BYTES = 176, Q6_K_BYTES = 210, Q5_0_BYTES = 22 };

/* Nibbles: byte i of the j-th run of 32 holds weight i of sub-block 2j (low nibble) and
 * of sub-block 2j + 1 (high nibble). */
static void q4_k_plain(const uint8_t *blk, float *out)
{
    struct kq_scales g;
    kq_sub_scales(blk, &g);
    const uint8_t *qs = blk + 16;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 32; i++) {
            out[64 * j + i] = g.ds[2 * j] * (float)(qs[32 * j + i] & 15) + g.neg_dm[2 * j];
            out[64 * j + 32 + i] =
                g.ds[2 * j + 1] * (float)(qs[32 * j + i] >> 4) + g.neg_dm[2 * j + 1];
        }
}

static void q5_k_plain(const uint8_t *blk, float *out)
{
    struct kq_scales g;
    kq_sub_scales(blk, &g);
    const uint8_t *qh = blk + 16, *qs = blk + 48;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 32; i++) {
            int lo = (qs[32 * j + i] & 15) | (((qh[i] >> (2 * j)) & 1) << 4);
            int hi = (qs[32 * j + i] >> 4) | (((qh[i] >> (2 * j + 1)) & 1) << 4);
            out[64 * j + i] = g.ds[2 * j] * (float)lo + g.neg_dm[2 * j];
            out[64 * j + 32 + i] = g.ds[2 * j + 1] * (float)hi + g.neg_dm[2 * j + 1];
        }
}

/* Each half of 128 weights: weight j takes the low (j < 64) or high nibble of ql[j % 64]
 * and bits 2 * (j / 32) .. + 1 of qh[j % 32] as its top two bits. */
static void q6_k_plain(const uint8_t *blk, float *out)
{
    const float d = qblock_half(blk + 208);
    const int8_t *scales = (const int8_t *)(blk + 192);
    /* Runs of 32 weights (t), so that the inner loop's shifts are fixed and it vectorizes. */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        for (int t = 0; t < 4; t++) {
            const float ds0 = d * (float)scales[8 * h + 2 * t], ds1 = d * (float)scales[8 * h + 2 * t + 1];
            const int lo_at = 32 * (t % 2), lo_shift = 4 * (t / 2), hi_shift = 2 * t;
            float *o = out + 128 * h + 32 * t;
            for (int i = 0; i < 32; i++) {
                int q = ((ql[lo_at + i] >> lo_shift) & 15) | (((qh[i] >> hi_shift) & 3) << 4);
                o[i] = (i < 16 ? ds0 : ds1) * (float)(q - 32);
            }
        }
    }
}

static void q5_0_plain(const uint8_t *blk, float *out)
{
    const float d = qblock_half(blk);
    const uint32_t qh = (uint32_t)qblock_load_u16(blk + 2) | (uint32_t)qblock_load_u16(blk + 4) << 16;
    const uint8_t *qs = blk + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        out[j] = d * (float)(lo - 16);
        out[j + 16] = d * (float)(hi - 16);
    }
}

void kq_dequant_plain(int format, const uint8_t *row, int64_t k, float *out)
{
    switch (format) {
    case QBLOCK_FORMAT_Q4_K:
        for (int64_t b = 0; b < k / QK_K; b++)
            q4_k_plain(row + b * Q4_K_BYTES, out + b * QK_K);
        break;
    case QBLOCK_FORMAT_Q5_K:
        for (int64_t b = 0; b < k / QK_K; b++)
            q5_k_plain(row + b * Q5_K_BYTES, out + b * QK_K);
        break;
    case QBLOCK_FORMAT_Q6_K:
        for (int64_t b = 0; b < k / QK_K; b++)
            q6_k_plain(row + b * Q6_K_BYTES, out + b * QK_K);
        break;
    case QBLOCK_FORMAT_Q5_0:
        for (int64_t b = 0; b < k / 32; b++)
            q5_0_plain(row + b * Q5_0_BYTES, out + b * 32);
        break;
    }
}
