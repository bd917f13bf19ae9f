/* A K-quant or Q5_0 group staged as one byte per weight (its integer values, put
 * together 32 at a time by byte ops) and its scales as floats: how the AVX2 code
 * (qblock_kquants_avx2.c) reads every format, and the AVX-512 code the 5-bit ones,
 * whose fifth bits cost more as vector lanes than as bytes. Layouts: qblock_kquants.h.
 * Include only from a file built with AVX2 enabled for these functions. */
#ifndef CBSERVE_QBLOCK_KQUANTS_STAGE_H
#define CBSERVE_QBLOCK_KQUANTS_STAGE_H

#include <immintrin.h>
#include <stdint.h>

#include "qblock_kquants.h"

#define KQ_STAGE_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_STAGE_INLINE static inline __attribute__((always_inline))

/* Signed values (Q6_K's q - 32, Q5_0's q - 16) are widened as int8, the others as uint8. */
KQ_STAGE_INLINE int kq_is_signed(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q6_K || FORMAT == QBLOCK_FORMAT_Q5_0;
}

/* A staged group: its values, one byte each, in the order of the weights, and its
 * scales: Q4_K / Q5_K d * sc[s] in 0-7, -dmin * mn[s] in 8-15 (32 weights each);
 * Q6_K d * scale[s] (16 weights each); Q5_0 d in 0. */
struct kq_staged {
    uint8_t q[256] __attribute__((aligned(32)));
    float sc[16] __attribute__((aligned(32)));
};

KQ_STAGE_TARGET KQ_STAGE_INLINE __m256i kq_nibbles_lo(__m256i v)
{
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

KQ_STAGE_TARGET KQ_STAGE_INLINE __m256i kq_nibbles_hi(__m256i v)
{
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
}

KQ_STAGE_TARGET KQ_STAGE_INLINE void kq_stage_k_scales(const uint8_t *blk, float *sc)
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

KQ_STAGE_TARGET KQ_STAGE_INLINE void kq_stage(const uint8_t *blk, const int FORMAT, struct kq_staged *s)
{
    if (FORMAT == QBLOCK_FORMAT_Q4_K || FORMAT == QBLOCK_FORMAT_Q5_K) {
        kq_stage_k_scales(blk, s->sc);
        const uint8_t *qs = blk + (FORMAT == QBLOCK_FORMAT_Q4_K ? 16 : 48);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        for (int j = 0; j < 4; j++) { /* run j: sub-blocks 2j (low nibbles), 2j + 1 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = kq_nibbles_lo(v), hi = kq_nibbles_hi(v);
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
                const __m256i lo = t < 2 ? kq_nibbles_lo(ql) : kq_nibbles_hi(ql);
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
        const __m256i nib = _mm256_blend_epi32(kq_nibbles_lo(v), kq_nibbles_hi(v), 0xf0);
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

#endif
