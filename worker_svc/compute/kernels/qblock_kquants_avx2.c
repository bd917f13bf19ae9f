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

/* Signed values (Q6_K's q - 32, Q5_0's q - 16) are widened as int8, the others as uint8. */
INLINE int is_signed(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q6_K || FORMAT == QBLOCK_FORMAT_Q5_0;
}

/* A staged group: its values, one byte each, in the order of the weights, and its
 * scales: Q4_K / Q5_K d * sc[s] in 0-7, -dmin * mn[s] in 8-15 (32 weights each);
 * Q6_K d * scale[s] (16 weights each); Q5_0 d in 0. */
struct staged {
    uint8_t q[QK_K] __attribute__((aligned(32)));
    float sc[16] __attribute__((aligned(32)));
};

AVX2_TARGET INLINE __m256i nibbles_lo(__m256i v)
{
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

AVX2_TARGET INLINE __m256i nibbles_hi(__m256i v)
{
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
}

AVX2_TARGET INLINE void stage_k_scales(const uint8_t *blk, float *sc)
{
    /* As qblock_kquants_avx512.c's group_scales: lane l's 6-bit field from byte a[l],
     * its top 2 bits (scales and mins 4-7) from byte b[l]. */
    const __m128i p = _mm_loadu_si128((const __m128i *)(blk + 4));
    const __m128i pick_a = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
    const __m128i pick_b = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7);
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    __m128i a = _mm_shuffle_epi8(p, pick_a), b = _mm_shuffle_epi8(p, pick_b);
    a = _mm_and_si128(_mm_blend_epi32(a, _mm_srli_epi16(a, 4), 8), keep);
    b = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));
    const __m128i fields = _mm_or_si128(a, b);
    const __m256 scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(fields));
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(fields, 8)));
    _mm256_store_ps(sc, _mm256_mul_ps(_mm256_set1_ps(qblock_half(blk)), scales));
    _mm256_store_ps(sc + 8, _mm256_mul_ps(_mm256_set1_ps(-qblock_half(blk + 2)), mins));
}

AVX2_TARGET INLINE void stage(const uint8_t *blk, const int FORMAT, struct staged *s)
{
    if (FORMAT == QBLOCK_FORMAT_Q4_K || FORMAT == QBLOCK_FORMAT_Q5_K) {
        stage_k_scales(blk, s->sc);
        const uint8_t *qs = blk + (FORMAT == QBLOCK_FORMAT_Q4_K ? 16 : 48);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        for (int j = 0; j < 4; j++) { /* run j: sub-blocks 2j (low nibbles), 2j + 1 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = nibbles_lo(v), hi = nibbles_hi(v);
            if (FORMAT == QBLOCK_FORMAT_Q5_K) {
                /* bit s of qh[i]: the fifth bit of weight i of sub-block s. */
                const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * j)));
                const __m256i b1 = _mm256_set1_epi8((char)(2 << (2 * j)));
                const __m256i sixteen = _mm256_set1_epi8(16);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
            }
            _mm256_store_si256((__m256i *)(s->q + 64 * j), lo);
            _mm256_store_si256((__m256i *)(s->q + 64 * j + 32), hi);
        }
    } else if (FORMAT == QBLOCK_FORMAT_Q6_K) {
        const __m256 d = _mm256_set1_ps(qblock_half(blk + 208));
        const __m128i scales = _mm_loadu_si128((const __m128i *)(blk + 192));
        _mm256_store_ps(s->sc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales))));
        _mm256_store_ps(s->sc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                           _mm_srli_si128(scales, 8)))));
        const __m256i two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; h++) {
            /* Weight j of the half: ql[j % 64]'s low (j < 64) or high nibble, bits
             * 2 * (j / 32) of qh[j % 32] as its top two bits. */
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            for (int t = 0; t < 4; t++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (t % 2)));
                const __m256i lo = t < 2 ? nibbles_lo(ql) : nibbles_hi(ql);
                const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), two);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(top, 4));
                _mm256_store_si256((__m256i *)(s->q + 128 * h + 32 * t), _mm256_sub_epi8(q, off));
            }
        }
    } else { /* Q5_0 */
        s->sc[0] = qblock_half(blk);
        uint32_t qh;
        memcpy(&qh, blk + 2, sizeof qh);
        const __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6));
        const __m256i v = _mm256_set_m128i(qs, qs);
        /* Bytes 0-15 the low nibbles (weights 0-15), 16-31 the high ones. */
        const __m256i nib = _mm256_blend_epi32(nibbles_lo(v), nibbles_hi(v), 0xf0);
        /* Byte j gets bit j of qh: byte j / 8 of qh spread over 8 bytes, one bit each. */
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh),
            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                             2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        const __m256i q = _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
        _mm256_store_si256((__m256i *)s->q, _mm256_sub_epi8(q, _mm256_set1_epi8(16)));
    }
}

/* Weights 8c .. 8c + 7 of a staged group. */
AVX2_TARGET INLINE __m256 weights8(const struct staged *s, int c, const int FORMAT)
{
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)(s->q + 8 * c));
    if (is_signed(FORMAT)) {
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
    struct staged s;
    for (int64_t b = 0; b < k / G; b++) {
        stage(row + b * group_bytes(FORMAT), FORMAT, &s);
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

/* RR weight rows x MM rows of x, RR * MM <= 8 accumulators (AVX2 has 16 registers). */
AVX2_TARGET INLINE void small(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                              float *y, int64_t ldy, const int FORMAT, const int RR, const int MM)
{
    const int G = group_weights(FORMAT), bytes = group_bytes(FORMAT);
    struct staged s[4];
    __m256 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            for (int line = 0; line < bytes; line += 64)
                _mm_prefetch((const char *)(blk + RR * row_bytes + line), _MM_HINT_T0);
            stage(blk, FORMAT, &s[r]);
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

/* Four rows at a time (two when M > 2), the rest one by one. */
#define SMALL_CASES(FORMAT)                                                                   \
    if (rows == 4 && m_count <= 2) {                                                          \
        m_count == 1 ? small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1)                        \
                     : small(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2);                       \
    } else if (rows == 4) {                                                                   \
        for (int64_t r = 0; r < 4; r += 2)                                                    \
            m_count == 3 ? small(w + r * row_bytes, row_bytes, x, k, y + r, ldy, FORMAT, 2, 3) \
                         : small(w + r * row_bytes, row_bytes, x, k, y + r, ldy, FORMAT, 2, 4); \
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
