/* AVX-512 code of the K-quant formats and Q5_0 (layouts: qblock_kquants.h).
 *
 * A group (super-block of 256, or Q5_0's block of 32) is read a unit at a time: 64
 * weights of Q4_K / Q5_K (one run of 32 nibble bytes), 128 of Q6_K (one half), the 32
 * of a Q5_0 block. A unit's weights are built in registers, 16 per vector, and go
 * straight to the FMAs with x (or to the panel buffer at large M), so the M = 1 decode
 * reads each weight byte once.
 *
 * What made it as fast per weight byte as Q4_1 (bench/micro/qblock_formats.py):
 * - A super-block's 6-bit scales and mins are unpacked by vector ops into one register
 *   (8 scales d * sc, 8 negated mins -dmin * mn) and stored once per row to the stack,
 *   where each sub-block's broadcast is a load; the scalar unpacking cost as much as
 *   the weights themselves.
 * - Q4_K, Q5_K and Q5_0 pick each weight from a table of the sub-block's (or block's)
 *   possible values, made by one FMA (or multiply) per 16 entries: vpermps reads a
 *   nibble's 4 bits, vpermt2ps a 5-bit value, so that no integer is converted.
 * - Q6_K's 6-bit values are put together 64 at a time with byte ops (nibbles, 2-bit
 *   highs, minus 32), then widened 16 at a time.
 * Every weight is still the float32 value gguf's dequantizer computes: a table entry
 * is fma(d * sc, q, -dmin * mn) rounded once (as the exact product minus the min is),
 * Q6_K's and Q5_0's the same multiply as theirs. */
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

/* Weights of a unit, and units of a group. */
INLINE int unit_weights(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q6_K ? 128 : FORMAT == QBLOCK_FORMAT_Q5_0 ? 32 : 64;
}

INLINE int group_units(const int FORMAT)
{
    return group_weights(FORMAT) / unit_weights(FORMAT);
}

AVX512_TARGET INLINE __m512i load16_u8(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

AVX512_TARGET INLINE __m512 levels(void)
{
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* A group's float scales, stored where the units broadcast them from: Q4_K / Q5_K
 * d * sc[s] in 0-7 and -dmin * mn[s] in 8-15; Q6_K d * scale[s] for 16 weights each;
 * Q5_0 d in 0. The 6-bit fields (qblock_kquants.h kq_sub_scales) are gathered by two
 * byte shuffles: lane l takes byte a[l] (and its top bits from byte b[l]). The 16-byte
 * load reads 4 bytes of the nibbles past the 12 bytes of scales. */
AVX512_TARGET INLINE void group_scales(const uint8_t *blk, const int FORMAT, float *sc)
{
    if (FORMAT == QBLOCK_FORMAT_Q6_K) {
        __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
        _mm512_store_ps(sc, _mm512_mul_ps(_mm512_set1_ps(qblock_half(blk + 208)),
                                          _mm512_cvtepi32_ps(s)));
        return;
    }
    if (FORMAT == QBLOCK_FORMAT_Q5_0) {
        sc[0] = qblock_half(blk);
        return;
    }
    /* Byte ops on 16 bytes (cheaper than on 16 dwords), then one widening. */
    const __m128i p = _mm_loadu_si128((const __m128i *)(blk + 4));
    const __m128i pick_a = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
    const __m128i pick_b = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7);
    const __m128i keep = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
    __m128i a = _mm_shuffle_epi8(p, pick_a), b = _mm_shuffle_epi8(p, pick_b);
    /* Mins 4-7 (bytes 12-15) are high nibbles; the others' fields start at bit 0. */
    a = _mm_and_si128(_mm_blend_epi32(a, _mm_srli_epi16(a, 4), 8), keep);
    /* b's 2 top bits to bits 4-5 (the 16-bit shift's spill from the next byte is masked). */
    b = _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30));
    const __m512 d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(qblock_half(blk)),
                                          _mm512_set1_ps(-qblock_half(blk + 2)));
    const __m512i fields = _mm512_cvtepu8_epi32(_mm_or_si128(a, b));
    _mm512_store_ps(sc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(fields)));
}

/* Q4_K / Q5_K: sub-block s's table of 16 weights d*sc*q - dmin*mn for q in `values`. */
AVX512_TARGET INLINE __m512 sub_table(const float *sc, int s, __m512 values)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(sc[s]), values, _mm512_set1_ps(sc[8 + s]));
}

/* Q5_K: the fifth bits of sub-block s's weights (bit s of each qh byte) moved to bit 4. */
AVX512_TARGET INLINE __m512i fifth_bits(__m512i qh, const int s)
{
    return s < 4 ? _mm512_slli_epi32(qh, 4 - s) : s > 4 ? _mm512_srli_epi32(qh, s - 4) : qh;
}

/* Unit u of the group at blk -> w[0 .. unit_weights / 16), in the order of the weights. */
AVX512_TARGET INLINE void unit_regs(const uint8_t *blk, const float *sc, const int u,
                                    const int FORMAT, __m512 *w)
{
    if (FORMAT == QBLOCK_FORMAT_Q4_K) {
        /* Byte i of the run: weight i of sub-block 2u (low nibble), of 2u + 1 (high).
         * vpermps reads an index's low 4 bits only: the low nibble needs no mask. */
        const __m512 ta = sub_table(sc, 2 * u, levels()), tb = sub_table(sc, 2 * u + 1, levels());
        const __m512i q0 = load16_u8(blk + 16 + 32 * u), q1 = load16_u8(blk + 32 + 32 * u);
        w[0] = _mm512_permutexvar_ps(q0, ta);
        w[1] = _mm512_permutexvar_ps(q1, ta);
        w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), tb);
        w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), tb);
    } else if (FORMAT == QBLOCK_FORMAT_Q5_K) {
        /* As Q4_K with a fifth bit: vpermt2ps picks from 32 values by bits 0-4. */
        const __m512i sel = _mm512_set1_epi32(16);
        const __m512i q0 = load16_u8(blk + 48 + 32 * u), q1 = load16_u8(blk + 64 + 32 * u);
        const __m512i h0 = load16_u8(blk + 16), h1 = load16_u8(blk + 32);
        for (int half = 0; half < 2; half++) {
            const int s = 2 * u + half;
            const __m512 lo = sub_table(sc, s, levels());
            const __m512 hi = sub_table(sc, s, _mm512_setr_ps(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31));
            const __m512i n0 = half ? _mm512_srli_epi32(q0, 4) : q0;
            const __m512i n1 = half ? _mm512_srli_epi32(q1, 4) : q1;
            /* (nibble & ~16) | (fifth bit & 16): bits above 4 are not read. */
            const __m512i i0 = _mm512_ternarylogic_epi32(n0, fifth_bits(h0, s), sel, 0xd8);
            const __m512i i1 = _mm512_ternarylogic_epi32(n1, fifth_bits(h1, s), sel, 0xd8);
            w[2 * half] = _mm512_permutex2var_ps(lo, i0, hi);
            w[2 * half + 1] = _mm512_permutex2var_ps(lo, i1, hi);
        }
    } else if (FORMAT == QBLOCK_FORMAT_Q6_K) {
        /* 64 bytes of low nibbles: weight j < 64 of the half takes byte j's low nibble,
         * j >= 64 byte j - 64's high one; its 2 top bits are bits 2 * (j / 32) of qh[j % 32].
         * A 16-bit shift per half of the broadcast qh brings them to bits 4-5 of each byte
         * (the other byte's bits land outside them). */
        const __m512i ql = _mm512_loadu_si512(blk + 64 * u);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * u)));
        const __m512i top = _mm512_set1_epi8(0x30), low = _mm512_set1_epi8(0x0f);
        /* Bytes 0-31 (words 0-15) and 32-63 take different bits of the same qh byte. */
        const __mmask32 upper = 0xffff0000u;
        const __m512i left = _mm512_mask_blend_epi16(upper, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
        const __m512i right = _mm512_mask_blend_epi16(upper, _mm512_setzero_si512(), _mm512_set1_epi16(2));
        const __m512i hi_a = _mm512_and_si512(_mm512_sllv_epi16(qh, left), top);
        const __m512i hi_b = _mm512_and_si512(_mm512_srlv_epi16(qh, right), top);
        /* (nibble & 15) | top bits, minus 32: the signed 6-bit values as int8. */
        const __m512i off = _mm512_set1_epi8(32);
        const __m512i va = _mm512_sub_epi8(_mm512_ternarylogic_epi32(ql, hi_a, low, 0xec), off);
        const __m512i vb = _mm512_sub_epi8(
            _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), hi_b, low, 0xec), off);
        /* Widened from the stack: a load, where a lane extract would be a shuffle. */
        int8_t values[128] __attribute__((aligned(64)));
        _mm512_store_si512(values, va);
        _mm512_store_si512(values + 64, vb);
        for (int c = 0; c < 8; c++)
            w[c] = _mm512_mul_ps(_mm512_set1_ps(sc[8 * u + c]),
                                 _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                     _mm_load_si128((const __m128i *)(values + 16 * c)))));
    } else {
        /* Q5_0: the 32 values d * (q - 16), picked by the nibble and the fifth bit (bit j
         * of qh for weight j): the bit is set into bit 4 of the index by a mask. */
        const float d = sc[0];
        const __m512 lo = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_sub_ps(levels(), _mm512_set1_ps(16.0f)));
        const __m512 hi = _mm512_mul_ps(_mm512_set1_ps(d), levels());
        uint32_t qh;
        memcpy(&qh, blk + 2, sizeof qh);
        const __m512i q = load16_u8(blk + 6), low4 = _mm512_set1_epi32(15);
        const __m512i sel = _mm512_set1_epi32(16);
        __m512i i0 = _mm512_and_si512(q, low4), i1 = _mm512_srli_epi32(q, 4);
        i0 = _mm512_mask_or_epi32(i0, (__mmask16)qh, i0, sel);
        i1 = _mm512_mask_or_epi32(i1, (__mmask16)(qh >> 16), i1, sel);
        w[0] = _mm512_permutex2var_ps(lo, i0, hi);
        w[1] = _mm512_permutex2var_ps(lo, i1, hi);
    }
}

AVX512_TARGET INLINE void dequant_rows(const uint8_t *row, int64_t k, float *out, const int FORMAT)
{
    const int G = group_weights(FORMAT), U = unit_weights(FORMAT);
    float sc[16] __attribute__((aligned(64)));
    for (int64_t b = 0; b < k / G; b++) {
        const uint8_t *blk = row + b * group_bytes(FORMAT);
        group_scales(blk, FORMAT, sc);
        for (int u = 0; u < group_units(FORMAT); u++) {
            __m512 w[8];
            unit_regs(blk, sc, u, FORMAT, w);
            for (int c = 0; c < U / 16; c++)
                _mm512_storeu_ps(out + b * G + u * U + 16 * c, w[c]);
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

/* RR weight rows x MM rows of x: up to 16 accumulators. A row's unit is built and used
 * before the next row's, so that its weights need only unit_weights / 16 registers. */
AVX512_TARGET INLINE void small(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                                float *y, int64_t ldy, const int FORMAT, const int RR, const int MM)
{
    const int G = group_weights(FORMAT), U = unit_weights(FORMAT), bytes = group_bytes(FORMAT);
    float sc[4][16] __attribute__((aligned(64)));
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            /* The next tile's rows, as qblock_q4q8.c's small_avx512 fetches them (a line
             * of 64 bytes at a time: a super-block spans three or four). */
            for (int line = 0; line < bytes; line += 64)
                _mm_prefetch((const char *)(blk + RR * row_bytes + line), _MM_HINT_T0);
            group_scales(blk, FORMAT, sc[r]);
        }
        for (int u = 0; u < group_units(FORMAT); u++) {
            const float *xu = x + b * G + u * U;
            /* One row of x: its unit in registers, loaded once for the RR rows. */
            __m512 xv[8];
            if (MM == 1)
                for (int c = 0; c < U / 16; c++)
                    xv[c] = _mm512_loadu_ps(xu + 16 * c);
            for (int r = 0; r < RR; r++) {
                __m512 wv[8];
                unit_regs(w + r * row_bytes + b * bytes, sc[r], u, FORMAT, wv);
                for (int c = 0; c < U / 16; c++)
                    for (int i = 0; i < MM; i++)
                        acc[r][i] = _mm512_fmadd_ps(
                            wv[c], MM == 1 ? xv[c] : _mm512_loadu_ps(xu + i * k + 16 * c),
                            acc[r][i]);
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
