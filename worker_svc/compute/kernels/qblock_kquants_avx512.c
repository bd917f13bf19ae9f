/* AVX-512 code of the K-quant formats and Q5_0 (layouts: qblock_kquants.h): a group
 * (super-block of 256, or Q5_0's block of 32) is read 16 weights at a time, each chunk
 * unpacked with integer ops, converted, and scaled by one FMA (or multiply) into a
 * register, so the weights go from memory to the dot products without a store and a
 * reload: the M = 1 decode reads each weight byte once. The group's scales are decoded
 * once per row into a small struct on the stack (L1). */
#include <immintrin.h>
#include <stdint.h>

#include "qblock_kquants.h"

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { QK_K = 256 };

INLINE int group_weights(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q5_0 ? 32 : QK_K;
}

INLINE int group_bytes(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q4_K ? 144
           : FORMAT == QBLOCK_FORMAT_Q5_K ? 176
           : FORMAT == QBLOCK_FORMAT_Q6_K ? 210
                                          : 22;
}

AVX512_TARGET INLINE __m512i load16_u8(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

AVX512_TARGET INLINE void group_scales(const uint8_t *blk, const int FORMAT, struct kq_scales *g)
{
    if (FORMAT == QBLOCK_FORMAT_Q6_K) {
        __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
        _mm512_storeu_ps(g->ds, _mm512_mul_ps(_mm512_set1_ps(qblock_half(blk + 208)),
                                              _mm512_cvtepi32_ps(s)));
    } else if (FORMAT == QBLOCK_FORMAT_Q5_0) {
        g->ds[0] = qblock_half(blk);
    } else {
        kq_sub_scales(blk, g);
    }
}

/* Q4_K's sub-block s: its 16 possible weights ds * q - dm (one FMA, rounded once as
 * numpy's subtraction after an exact product), which vpermps picks by nibble. */
AVX512_TARGET INLINE __m512 q4_k_table(const struct kq_scales *g, int s)
{
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(_mm512_set1_ps(g->ds[s]), levels, _mm512_set1_ps(g->neg_dm[s]));
}

/* Weights 16c .. 16c + 15 of the group at blk (c a constant after unrolling). Q4_K takes
 * its sub-block's table (q4_k_table, made once for the sub-block's two chunks): 3 ops
 * for 16 weights where converting and scaling takes 5, which measured 14 against Q4_1's
 * 30 GFLOP/s at M = 1. */
AVX512_TARGET INLINE __m512 chunk(const uint8_t *blk, const struct kq_scales *g, const int c,
                                  const int FORMAT, __m512 table)
{
    const __m512i low4 = _mm512_set1_epi32(15);
    if (FORMAT == QBLOCK_FORMAT_Q4_K) {
        const int s = c / 2;
        __m512i q = load16_u8(blk + 16 + 32 * (s / 2) + 16 * (c % 2));
        /* vpermps reads an index's low 4 bits only: the low nibble needs no mask. */
        return _mm512_permutexvar_ps(s % 2 ? _mm512_srli_epi32(q, 4) : q, table);
    }
    if (FORMAT == QBLOCK_FORMAT_Q5_K) {
        const int s = c / 2;
        __m512i q = load16_u8(blk + 48 + 32 * (s / 2) + 16 * (c % 2));
        q = s % 2 ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, low4);
        __m512i qh = _mm512_srli_epi32(load16_u8(blk + 16 + 16 * (c % 2)), s);
        q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_and_si512(qh, _mm512_set1_epi32(1)), 4));
        return _mm512_fmadd_ps(_mm512_set1_ps(g->ds[s]), _mm512_cvtepi32_ps(q),
                               _mm512_set1_ps(g->neg_dm[s]));
    }
    if (FORMAT == QBLOCK_FORMAT_Q6_K) {
        const int h = c / 8, cc = c % 8;
        __m512i ql = _mm512_srli_epi32(load16_u8(blk + 64 * h + 16 * (cc % 4)), 4 * (cc / 4));
        __m512i qh = _mm512_srli_epi32(load16_u8(blk + 128 + 32 * h + 16 * (cc % 2)), 2 * (cc / 2));
        __m512i q = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                    _mm512_slli_epi32(_mm512_and_si512(qh, _mm512_set1_epi32(3)), 4));
        q = _mm512_sub_epi32(q, _mm512_set1_epi32(32));
        return _mm512_mul_ps(_mm512_set1_ps(g->ds[c]), _mm512_cvtepi32_ps(q));
    }
    /* Q5_0: the fifth bits of the chunk's 16 weights are a mask of the uint32 qh. */
    uint32_t qh;
    memcpy(&qh, blk + 2, sizeof qh);
    __m512i q = load16_u8(blk + 6);
    q = c ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, low4);
    q = _mm512_mask_or_epi32(q, (__mmask16)(qh >> (16 * c)), q, _mm512_set1_epi32(16));
    q = _mm512_sub_epi32(q, _mm512_set1_epi32(16));
    return _mm512_mul_ps(_mm512_set1_ps(g->ds[0]), _mm512_cvtepi32_ps(q));
}

AVX512_TARGET INLINE void dequant_rows(const uint8_t *row, int64_t k, float *out, const int FORMAT)
{
    const int G = group_weights(FORMAT);
    for (int64_t b = 0; b < k / G; b++) {
        const uint8_t *blk = row + b * group_bytes(FORMAT);
        struct kq_scales g;
        group_scales(blk, FORMAT, &g);
        __m512 table = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int c = 0; c < G / 16; c++) {
            if (FORMAT == QBLOCK_FORMAT_Q4_K && c % 2 == 0)
                table = q4_k_table(&g, c / 2);
            _mm512_storeu_ps(out + b * G + 16 * c, chunk(blk, &g, c, FORMAT, table));
        }
    }
}

AVX512_TARGET void kq_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out)
{
    switch (format) {
    case QBLOCK_FORMAT_Q4_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q4_K); break;
    case QBLOCK_FORMAT_Q5_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q5_K); break;
    case QBLOCK_FORMAT_Q6_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q6_K); break;
    case QBLOCK_FORMAT_Q5_0: dequant_rows(row, k, out, QBLOCK_FORMAT_Q5_0); break;
    }
}

/* RR weight rows x MM rows of x: up to 16 accumulators. */
AVX512_TARGET INLINE void small(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                                float *y, int64_t ldy, const int FORMAT, const int RR, const int MM)
{
    const int G = group_weights(FORMAT), bytes = group_bytes(FORMAT);
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        struct kq_scales g[4];
        __m512 table[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                           _mm512_setzero_ps()};
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            /* The next tile's rows, as qblock_q4q8.c's small_avx512 fetches them (a line
             * of 64 bytes at a time: a super-block spans three or four). */
            for (int line = 0; line < bytes; line += 64)
                _mm_prefetch((const char *)(blk + RR * row_bytes + line), _MM_HINT_T0);
            group_scales(blk, FORMAT, &g[r]);
        }
#pragma GCC unroll 16
        for (int c = 0; c < G / 16; c++) {
            __m512 wv[4];
            if (FORMAT == QBLOCK_FORMAT_Q4_K && c % 2 == 0)
                for (int r = 0; r < RR; r++)
                    table[r] = q4_k_table(&g[r], c / 2);
            for (int r = 0; r < RR; r++)
                wv[r] = chunk(w + r * row_bytes + b * bytes, &g[r], c, FORMAT, table[r]);
            for (int i = 0; i < MM; i++) {
                __m512 xv = _mm512_loadu_ps(x + i * k + b * G + 16 * c);
                for (int r = 0; r < RR; r++)
                    acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#define SMALL_CASES(FORMAT)                                                                   \
    switch (m_count * 8 + (rows == 4 ? 4 : 1)) {                                              \
    case 12: small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1); break;                          \
    case 20: small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2); break;                          \
    case 28: small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 3); break;                          \
    case 36: small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 4); break;                          \
    default:                                                                                  \
        for (int64_t r = 0; r < rows; r++)                                                    \
            for (int64_t i = 0; i < m_count; i++)                                             \
                small(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy,       \
                      FORMAT, 1, 1);                                                          \
    }

AVX512_TARGET void kq_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes,
                                        int64_t rows, const float *x, int64_t m_count,
                                        int64_t k, float *y, int64_t ldy)
{
    switch (format) {
    case QBLOCK_FORMAT_Q4_K: SMALL_CASES(QBLOCK_FORMAT_Q4_K) break;
    case QBLOCK_FORMAT_Q5_K: SMALL_CASES(QBLOCK_FORMAT_Q5_K) break;
    case QBLOCK_FORMAT_Q6_K: SMALL_CASES(QBLOCK_FORMAT_Q6_K) break;
    case QBLOCK_FORMAT_Q5_0: SMALL_CASES(QBLOCK_FORMAT_Q5_0) break;
    }
}
