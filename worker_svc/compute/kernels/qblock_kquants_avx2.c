/* AVX2 code of the K-quant formats and Q5_0 (layouts: qblock_kquants.h), for the CPUs
 * without AVX-512 (AVX2, FMA and F16C).
 *
 * A group (super-block of 256 or Q5_0's block of 32) is taken in two steps:
 * - staged: its integer values are put together 32 at a time with byte ops (nibbles,
 *   fifth bits, Q6_K's 2-bit highs) into a small buffer on the stack, one byte each,
 *   and its scales unpacked into floats (qblock_kquants.h's fields, by 16-byte ops);
 * - used: 8 bytes at a time are widened, converted and scaled into one register of
 *   weights, which the FMAs take at once (small M), or which is stored into the panel
 *   buffer (large M).
 * AVX2 has no 16-entry float lookup (vpermps reads 8), so a weight is converted:
 * fma(d * sc, q, -dmin * mn) rounds once as gguf's d * sc * q - dmin * mn does after its
 * exact product; Q6_K and Q5_0 multiply as gguf does. */
#include <immintrin.h>
#include <stdint.h>

#include "qblock_kquants.h"
#include "qblock_kquants_stage.h"
#include "qblock_prefetch.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
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

/* Weights 8c .. 8c + 7 of a staged group. */
AVX2_TARGET INLINE __m256 weights8(const struct kq_staged *s, int c, const int FORMAT)
{
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(s->q + 8 * c));
    if (kq_is_signed(FORMAT)) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
        const float scale = FORMAT == QBLOCK_FORMAT_Q6_K ? s->sc[c / 2] : s->sc[0];
        return _mm256_mul_ps(_mm256_set1_ps(scale), q);
    }
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    return _mm256_fmadd_ps(_mm256_set1_ps(s->sc[c / 4]), q, _mm256_set1_ps(s->sc[8 + c / 4]));
}

AVX2_TARGET INLINE void dequant_rows(const uint8_t *row, int64_t k, float *out, const int FORMAT)
{
    const int G = group_weights(FORMAT);
    struct kq_staged s;
    for (int64_t b = 0; b < k / G; b++) {
        kq_stage(row + b * group_bytes(FORMAT), FORMAT, &s);
        for (int c = 0; c < G / 8; c++)
            _mm256_storeu_ps(out + b * G + 8 * c, weights8(&s, c, FORMAT));
    }
}

AVX2_TARGET void kq_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out)
{
    switch (format) {
    case QBLOCK_FORMAT_Q4_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q4_K); break;
    case QBLOCK_FORMAT_Q5_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q5_K); break;
    case QBLOCK_FORMAT_Q6_K: dequant_rows(row, k, out, QBLOCK_FORMAT_Q6_K); break;
    case QBLOCK_FORMAT_Q5_0: dequant_rows(row, k, out, QBLOCK_FORMAT_Q5_0); break;
    }
}

AVX2_TARGET INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* RR weight rows x MM rows of x, RR * MM <= 8 accumulators. */
AVX2_TARGET INLINE void small(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                              float *y, int64_t ldy, const int FORMAT, const int RR, const int MM)
{
    const int G = group_weights(FORMAT), bytes = group_bytes(FORMAT);
    struct kq_staged s[4];
    __m256 acc[4][8];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            for (int line = 0; line < bytes; line += 64)
                QBLOCK_PREFETCH_AHEAD(blk + line);
            kq_stage(blk, FORMAT, &s[r]);
        }
        for (int c = 0; c < G / 8; c++)
            for (int r = 0; r < RR; r++) {
                const __m256 wv = weights8(&s[r], c, FORMAT);
                for (int i = 0; i < MM; i++)
                    acc[r][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * k + b * G + 8 * c),
                                                acc[r][i]);
            }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = hsum(acc[r][i]);
}

/* Four rows at a time with 1-2 rows of x, two with 3-4, one with 5-8 (8 accumulators:
 * AVX2 has 16 registers), so that each weight is built once; a partial tile row by row. */
#define SMALL_CASES(FORMAT)                                                                   \
    if (rows == 4 && m_count <= 2) {                                                          \
        m_count == 1 ? small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1)                        \
                     : small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2);                       \
    } else if (rows == 4 && m_count <= 4) {                                                   \
        for (int64_t r = 0; r < 4; r += 2)                                                    \
            m_count == 3 ? small(w + r * row_bytes, row_bytes, x, k, y + r, ldy, FORMAT, 2, 3) \
                         : small(w + r * row_bytes, row_bytes, x, k, y + r, ldy, FORMAT, 2, 4); \
    } else if (rows == 4) {                                                                   \
        for (int64_t r = 0; r < 4; r++) {                                                     \
            const uint8_t *w1 = w + r * row_bytes;                                            \
            switch (m_count) {                                                                \
            case 5: small(w1, row_bytes, x, k, y + r, ldy, FORMAT, 1, 5); break;              \
            case 6: small(w1, row_bytes, x, k, y + r, ldy, FORMAT, 1, 6); break;              \
            case 7: small(w1, row_bytes, x, k, y + r, ldy, FORMAT, 1, 7); break;              \
            default: small(w1, row_bytes, x, k, y + r, ldy, FORMAT, 1, 8); break;             \
            }                                                                                 \
        }                                                                                     \
    } else {                                                                                  \
        for (int64_t r = 0; r < rows; r++)                                                    \
            for (int64_t i = 0; i < m_count; i++)                                             \
                small(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy,       \
                      FORMAT, 1, 1);                                                          \
    }

AVX2_TARGET void kq_small_tile_avx2(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                                    const float *x, int64_t m_count, int64_t k, float *y,
                                    int64_t ldy)
{
    switch (format) {
    case QBLOCK_FORMAT_Q4_K: SMALL_CASES(QBLOCK_FORMAT_Q4_K) break;
    case QBLOCK_FORMAT_Q5_K: SMALL_CASES(QBLOCK_FORMAT_Q5_K) break;
    case QBLOCK_FORMAT_Q6_K: SMALL_CASES(QBLOCK_FORMAT_Q6_K) break;
    case QBLOCK_FORMAT_Q5_0: SMALL_CASES(QBLOCK_FORMAT_Q5_0) break;
    }
}
