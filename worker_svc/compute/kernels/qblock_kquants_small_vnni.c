/* The VNNI kernel's small-M tiles (m <= KQ_SMALL_VNNI_M rows of x: one stream's decode,
 * a few sequences) for Q5_0, Q4_K and Q6_K, which pack no panel: each block's integers are
 * widened to int16 in registers and meet a row of x's 16-bit activation blocks
 * (qblock_vnni.c's: per 32 values qx, a scale dx, sx = dx * sum(qx)) in one vpmaddwd
 * per 32 weights, so each weight byte is read once, as the float tiles read it
 * (qblock_kquants_avx512.c), with fewer instructions a weight than their table lookups:
 *   Q5_0: w = d (q - 16):           sum_j w_j x_j ~= d dx sum_j q_j qx_j - 16 d sx
 *   Q4_K: w = d sc q - dmin mn:     per sub-block, d sc dx sum_j q_j qx_j - dmin mn sx
 *   Q6_K: w = d sc (q - 32):        per 16 weights, d sc dx sum_j (q_j - 32) qx_j
 * The products of a block are exact integers (|q qx| < 2^20, 32 of them); each block's
 * sum is scaled to float once, and a row's blocks are added in float. 16-bit activations
 * as the large-M kernel's (qblock_vnni.c says why not 8), chosen at small M only by the
 * native decode step's AVX-512 variant (decode_panels.h). Measured on Zen 4 (4 rows of
 * K = 576 or 1536, M = 1, against the float tiles): bench/RESULTS.md, "16-bit activations
 * at one row". */
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_kquants.h"
#include "qblock_kquants_stage.h"
#include "qblock_prefetch.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { QK = 32, Q5_0_BYTES = 22, Q4_K_BYTES = 144, Q4_K_SUBS = 8, Q6_K_BYTES = 210 };

int kq_small_vnni_reads(int format)
{
    return format == QBLOCK_FORMAT_Q5_0 || format == QBLOCK_FORMAT_Q4_K ||
           format == QBLOCK_FORMAT_Q6_K;
}

/* RR weight rows (a constant) of Q5_0 against one row of x: low nibbles then high ones
 * widened to the block's 32 words, the fifth bit added under a mask (bit j: word j). */
VNNI_TARGET INLINE void q5_0_rows(const uint8_t *w, int64_t row_bytes, const int16_t *qx,
                                  const float *dx, const float *sx, int64_t k, float *y,
                                  const int RR)
{
    const __m256i low = _mm256_set1_epi16(15);
    const __m512i sixteen = _mm512_set1_epi16(16);
    __m512 acc[4];
    float offset[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = 0; r < RR; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK; b++) {
        const __m512i xv = _mm512_loadu_si512(qx + QK * b);
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * Q5_0_BYTES;
            QBLOCK_PREFETCH_AHEAD(blk);
            const float d = qblock_half(blk);
            uint32_t qh;
            memcpy(&qh, blk + 2, sizeof qh);
            const __m256i qs = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + 6)));
            __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(qs, low)),
                                           _mm256_srli_epi16(qs, 4), 1);
            q = _mm512_mask_add_epi16(q, (__mmask32)qh, q, sixteen);
            const __m512i dot = _mm512_madd_epi16(q, xv);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(d * dx[b]), acc[r]);
            offset[r] += d * sx[b];
        }
    }
    for (int r = 0; r < RR; r++)
        y[r] = _mm512_reduce_add_ps(acc[r]) - 16.0f * offset[r];
}

/* RR weight rows of Q4_K against one row of x. A super-block's 32-byte run j holds
 * sub-block 2j in its low nibbles and 2j + 1 in its high ones, in weight order; its
 * scales come unpacked as the staged code's (d sc in 0-7, -dmin mn in 8-15), times x's
 * dx per sub-block, and its minimums meet x's sx 8 lanes at a time. */
VNNI_TARGET INLINE void q4_k_rows(const uint8_t *w, int64_t row_bytes, const int16_t *qx,
                                  const float *dx, const float *sx, int64_t k, float *y,
                                  const int RR)
{
    const __m512i low = _mm512_set1_epi16(15);
    __m512 acc[4];
    __m256 mins[4];
    for (int r = 0; r < RR; r++)
        acc[r] = _mm512_setzero_ps(), mins[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / 256; b++) {
        const int64_t xb = b * Q4_K_SUBS;
        const __m256 dx8 = _mm256_loadu_ps(dx + xb), sx8 = _mm256_loadu_ps(sx + xb);
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * Q4_K_BYTES;
            for (int line = 0; line < Q4_K_BYTES; line += 64)
                QBLOCK_PREFETCH_AHEAD(blk + line);
            float sc[16] __attribute__((aligned(32)));
            kq_stage_k_scales(blk, sc);
            float scale[8] __attribute__((aligned(32)));
            _mm256_store_ps(scale, _mm256_mul_ps(_mm256_load_ps(sc), dx8));
            mins[r] = _mm256_fmadd_ps(_mm256_load_ps(sc + 8), sx8, mins[r]);
            for (int j = 0; j < 4; j++) {
                const __m512i v =
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * j)));
                const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_srli_epi16(v, 4);
                const __m512i dlo = _mm512_madd_epi16(lo, _mm512_loadu_si512(qx + QK * (xb + 2 * j)));
                const __m512i dhi =
                    _mm512_madd_epi16(hi, _mm512_loadu_si512(qx + QK * (xb + 2 * j + 1)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dlo), _mm512_set1_ps(scale[2 * j]), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dhi), _mm512_set1_ps(scale[2 * j + 1]),
                                         acc[r]);
            }
        }
    }
    for (int r = 0; r < RR; r++) {
        const __m128 m4 = _mm_add_ps(_mm256_castps256_ps128(mins[r]), _mm256_extractf128_ps(mins[r], 1));
        const __m128 m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
        y[r] = _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(_mm_add_ss(m2, _mm_movehdup_ps(m2)));
    }
}

/* RR weight rows of Q6_K against one row of x. A super-block's half h (128 weights)
 * is ql[64 h ..] (low nibbles), qh[32 h ..] (top two bits) and scales 8h .. 8h + 7 of 16
 * weights each: with a = ql[l], b = ql[32 + l], c = qh[l] (l < 32) as words,
 *   weight l      = (a & 15) | (c << 4 & 48)     weight 64 + l = (a >> 4) | (c & 48)
 *   weight 32 + l = (b & 15) | (c << 2 & 48)     weight 96 + l = (b >> 4) | (c >> 2 & 48)
 * minus 32, built as words in registers (no staging through memory) and meeting one
 * activation block in one vpmaddwd, whose lanes 0-7 are 16 weights of one scale and
 * 8-15 the next 16's: each lane scaled by its own d sc dx, as the panel scales each
 * block of 16 (qblock_kquants_vnni.c). Q6_K is llama-quantize's LM head in Q4_K_M
 * files, the largest read of a small model's step. */
VNNI_TARGET INLINE __m512i q6_k_words(__m512i nibbles, __m512i tops)
{
    /* nibbles | (tops & 48), minus 32: the nibbles come masked or shifted into bits 0-3;
     * 0xD8 takes each bit from tops where the mask (48) has it, else from nibbles. */
    const __m512i bits = _mm512_ternarylogic_epi32(nibbles, tops, _mm512_set1_epi16(48), 0xD8);
    return _mm512_sub_epi16(bits, _mm512_set1_epi16(32));
}

VNNI_TARGET INLINE void q6_k_rows(const uint8_t *w, int64_t row_bytes, const int16_t *qx,
                                  const float *dx, int64_t k, float *y, const int RR)
{
    /* Lane l of scale vector for chunk c (32 weights): scale 2c (l < 8) or 2c + 1. */
    const __m512i pair_of_dx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i low = _mm512_set1_epi16(15);
    __m512 acc[4];
    for (int r = 0; r < RR; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 256; b++) {
        const int64_t xb = b * 8;
        /* dx of the x block each scale's 16 weights fall in: scale s -> block s / 2. */
        const __m512 dx16 =
            _mm512_permutexvar_ps(pair_of_dx, _mm512_castps256_ps512(_mm256_loadu_ps(dx + xb)));
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * Q6_K_BYTES;
            for (int line = 0; line < Q6_K_BYTES; line += 64)
                QBLOCK_PREFETCH_AHEAD(blk + line);
            const __m512 d = _mm512_set1_ps(qblock_half(blk + 208));
            const __m512 sc = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
            /* d * sc rounded first, as the staged scales are, then times dx. */
            const __m512 scales = _mm512_mul_ps(_mm512_mul_ps(d, sc), dx16);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)ql));
                const __m512i bq = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(ql + 32)));
                const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qh));
                __m512i q[4];
                q[0] = q6_k_words(_mm512_and_si512(a, low), _mm512_slli_epi16(c, 4));
                q[1] = q6_k_words(_mm512_and_si512(bq, low), _mm512_slli_epi16(c, 2));
                q[2] = q6_k_words(_mm512_srli_epi16(a, 4), c);
                q[3] = q6_k_words(_mm512_srli_epi16(bq, 4), _mm512_srli_epi16(c, 2));
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const int chunk = 4 * h + j;
                    const __m512i dot =
                        _mm512_madd_epi16(q[j], _mm512_loadu_si512(qx + QK * (xb + chunk)));
                    const __m512i lanes = _mm512_add_epi32(halves, _mm512_set1_epi32(2 * chunk));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                             _mm512_permutexvar_ps(lanes, scales), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < RR; r++)
        y[r] = _mm512_reduce_add_ps(acc[r]);
}

#define ROWS_OF(FORMAT, RR)                                                                     \
    (FORMAT == QBLOCK_FORMAT_Q5_0                                                              \
         ? q5_0_rows(w + r * row_bytes, row_bytes, qx + i * k, dx + i * x_blocks,               \
                     sx + i * x_blocks, k, y + i * ldy + r, RR)                                \
     : FORMAT == QBLOCK_FORMAT_Q6_K                                                             \
         ? q6_k_rows(w + r * row_bytes, row_bytes, qx + i * k, dx + i * x_blocks, k,            \
                     y + i * ldy + r, RR)                                                      \
         : q4_k_rows(w + r * row_bytes, row_bytes, qx + i * k, dx + i * x_blocks,               \
                     sx + i * x_blocks, k, y + i * ldy + r, RR))

/* Rows 0 .. rows - 1 of the weight at w times the m quantized rows of x into y[m, ldy],
 * four weight rows at a time, each row of x in turn (the tile's weights stay in L1). */
VNNI_TARGET INLINE void small_rows(const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t k,
                                   const int16_t *qx, const float *dx, const float *sx,
                                   int64_t m, float *y, int64_t ldy, const int FORMAT)
{
    const int64_t x_blocks = k / QK;
    for (int64_t i = 0; i < m; i++) {
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4)
            ROWS_OF(FORMAT, 4);
        for (; r < rows; r++)
            ROWS_OF(FORMAT, 1);
    }
}

VNNI_TARGET void kq_small_vnni(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                               int64_t k, const int16_t *qx, const float *dx, const float *sx,
                               int64_t m, float *y, int64_t ldy)
{
    if (format == QBLOCK_FORMAT_Q5_0)
        small_rows(w, row_bytes, rows, k, qx, dx, sx, m, y, ldy, QBLOCK_FORMAT_Q5_0);
    else if (format == QBLOCK_FORMAT_Q6_K)
        small_rows(w, row_bytes, rows, k, qx, dx, sx, m, y, ldy, QBLOCK_FORMAT_Q6_K);
    else
        small_rows(w, row_bytes, rows, k, qx, dx, sx, m, y, ldy, QBLOCK_FORMAT_Q4_K);
}
