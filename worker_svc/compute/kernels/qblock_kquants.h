/* The block formats of llama.cpp's K-quant files beside Q4_1 and Q8_0 (qblock_q4q8.c):
 * Q4_K, Q5_K and Q6_K (super-blocks of 256 weights with 6- or 8-bit sub-block scales)
 * and Q5_0 (32 weights, where a row is not a multiple of 256). Their layouts are those
 * of gguf-py's numpy dequantizers (gguf/quants.py), and each weight is the float32 value
 * that dequantizer computes:
 *   Q4_K (144 bytes / 256): f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins,
 *        128 bytes of nibbles; sub-block s (32 weights) has w = d*sc[s] * q - dmin*mn[s].
 *   Q5_K (176 bytes / 256): as Q4_K, then 32 bytes qh (bit s of qh[i]: the fifth bit of
 *        weight i of sub-block s) before the nibbles.
 *   Q6_K (210 bytes / 256): 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8
 *        scales (one per 16 weights), f16 d last; w = d*scale * (q - 32).
 *   Q5_0 (22 bytes / 32): f16 d, uint32 of fifth bits, 16 bytes of nibbles;
 *        w = d * (q - 16).
 * The sub-block scale d*sc is exact in float32 (11 + 8 significant bits at most), so is
 * its product by q, and w is rounded once: an FMA computes the same w. */
#ifndef CBSERVE_QBLOCK_KQUANTS_H
#define CBSERVE_QBLOCK_KQUANTS_H

#include <stdint.h>

#include "qblock_gemm.h"
#include "qblock_half.h"

/* A group's scales as the kernels use them: one per 16 weights (Q6_K) or per 32, and
 * the negated minimum (Q4_K, Q5_K) so that w = fma(ds, q, neg_dm). */
struct kq_scales {
    float ds[16], neg_dm[16];
};

static inline int kq_is_kquant_format(int format)
{
    return format >= QBLOCK_FORMAT_Q4_K && format <= QBLOCK_FORMAT_Q5_0;
}

/* Weights of a group (super-block, or Q5_0's block) of a K-quant format. */
static inline int kq_group_weights(int format)
{
    return format == QBLOCK_FORMAT_Q5_0 ? 32 : 256;
}

/* Q4_K / Q5_K: 8 sub-block scales and mins of 6 bits in 12 bytes. Bytes 0-3 hold scales
 * 0-3 and, in their top 2 bits, bits 4-5 of scales 4-7; bytes 4-7 the same for the mins;
 * bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble). */
static inline void kq_sub_scales(const uint8_t *blk, struct kq_scales *g)
{
    const float d = qblock_half(blk), dmin = qblock_half(blk + 2);
    const uint8_t *p = blk + 4;
    for (int j = 0; j < 4; j++) {
        g->ds[j] = d * (float)(p[j] & 63);
        g->neg_dm[j] = -(dmin * (float)(p[j + 4] & 63));
        g->ds[j + 4] = d * (float)((p[j + 8] & 15) | ((p[j] >> 6) << 4));
        g->neg_dm[j + 4] = -(dmin * (float)((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4)));
    }
}

void kq_dequant_plain(int format, const uint8_t *row, int64_t k, float *out);
void kq_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out);
void kq_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out);
/* Rows of x the small tiles take (qblock_gemm.c's panels use them up to this M). */
enum { KQ_SMALL_M = 8 };

/* rows <= 4 weight rows times m_count <= KQ_SMALL_M rows of x, weights dequantized in
 * registers (as qblock_q4q8.c's q4q8_small_tile_avx512 for Q4_1 / Q8_0). */
void kq_small_tile_avx2(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                        const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);
void kq_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                          const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);

/* The VNNI kernel's panel (qblock_vnni.h's qblock_vnni_panel) for these formats, in
 * qblock_kquants_vnni.c. Q5_0, Q4_K and Q6_K at m <= KQ_SMALL_VNNI_M rows of x pack no panel:
 * their blocks are widened in registers (qblock_kquants_small_vnni.c; the native decode
 * step's small M). */
enum { KQ_SMALL_VNNI_M = 8 };
int kq_small_vnni_reads(int format);
void kq_small_vnni(int format, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t k,
                   const int16_t *qx, const float *dx, const float *sx, int64_t m, float *y,
                   int64_t ldy);
void kq_vnni_panel(int format, const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                   const int16_t *qx, const float *dx, const float *sx, int64_t m, float *y,
                   int64_t ldy, int16_t *tmp, float *wd);

#endif
