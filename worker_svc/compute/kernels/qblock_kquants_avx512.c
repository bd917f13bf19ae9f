/* AVX-512 code of the K-quant formats and Q5_0 (layouts: qblock_kquants.h).
 *
 * Weights are built in registers, 16 per vector, and go straight to the FMAs with x
 * (or to the panel buffer at large M), so the M = 1 decode reads each weight byte once.
 * Two ways, each format taking the one measured faster on Zen 4 (bench/micro/
 * qblock_formats.py, M = 1, 576 x 1536, GFLOP/s, Q4_1 36.5):
 * - in units (Q4_K, Q5_0): 64 weights of Q4_K (a run of 32 nibble bytes), Q5_0's 32,
 *   each weight picked from a table of its sub-block's (block's) possible values made by
 *   one FMA (multiply) per 16 entries: vpermps reads a nibble's 4 bits, vpermt2ps a
 *   5-bit value, and no integer is converted. Q4_K 32.2 (26.6 staged), Q5_0 25.8 (22.8).
 * - staged (Q5_K, Q6_K; qblock_kquants_stage.h): a group's values put together as bytes
 *   32 at a time by byte ops, then widened, converted and scaled 16 at a time. Q5_K
 *   22.6 (20.7 in units), Q6_K 28.2 (25.0 in units, its highs by 512-bit byte ops).
 * A super-block's 6-bit scales and mins are unpacked by 16-byte ops and one widening
 * into a register (8 scales d * sc, 8 negated mins -dmin * mn), stored once per row to
 * the stack, where each sub-block's broadcast is a load: the scalar unpacking before
 * cost as much as the weights (Q4_K 18.3 before this file's rewrite).
 * Every weight is still the float32 value gguf's dequantizer computes: a table entry or
 * a converted value is fma(d * sc, q, -dmin * mn), rounded once as the exact product
 * minus the min is; Q6_K's and Q5_0's the same multiply as gguf's. */
#include <immintrin.h>
#include <stdint.h>

#include "qblock_kquants.h"
#include "qblock_kquants_stage.h"
#include "qblock_prefetch.h"
#include "qblock_small_cases.h"

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

/* The formats built in units (the others are staged), a unit's weights, and a group's units. */
INLINE int staged_format(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q5_K || FORMAT == QBLOCK_FORMAT_Q6_K;
}

INLINE int unit_weights(const int FORMAT)
{
    return FORMAT == QBLOCK_FORMAT_Q5_0 ? 32 : 64;
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

/* A unit-built group's float scales, stored where the units broadcast them from: Q4_K
 * d * sc[s] in 0-7 and -dmin * mn[s] in 8-15; Q5_0 d in 0. The 6-bit fields
 * (qblock_kquants.h kq_sub_scales) are gathered by two byte shuffles: lane l takes byte
 * a[l] (and its top bits from byte b[l]). The 16-byte load reads 4 bytes of the nibbles
 * past the 12 bytes of scales. */
AVX512_TARGET INLINE void group_scales(const uint8_t *blk, const int FORMAT, float *sc)
{
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

/* Q4_K: sub-block s's table of 16 weights d*sc*q - dmin*mn for q in `values`. */
AVX512_TARGET INLINE __m512 sub_table(const float *sc, int s, __m512 values)
{
    return _mm512_fmadd_ps(_mm512_set1_ps(sc[s]), values, _mm512_set1_ps(sc[8 + s]));
}

/* Unit u of the group at blk (Q4_K, Q5_0) -> w[0 .. unit_weights / 16), in the order
 * of the weights. */
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

/* Weights 16c .. 16c + 15 of a staged group (qblock_kquants_stage.h). */
AVX512_TARGET INLINE __m512 staged16(const struct kq_staged *s, int c, const int FORMAT)
{
    const __m128i bytes = _mm_load_si128((const __m128i *)(s->q + 16 * c));
    if (kq_is_signed(FORMAT)) {
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
        return _mm512_mul_ps(_mm512_set1_ps(FORMAT == QBLOCK_FORMAT_Q6_K ? s->sc[c] : s->sc[0]), q);
    }
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
    return _mm512_fmadd_ps(_mm512_set1_ps(s->sc[c / 2]), q, _mm512_set1_ps(s->sc[8 + c / 2]));
}

AVX512_TARGET INLINE void dequant_rows(const uint8_t *row, int64_t k, float *out, const int FORMAT)
{
    const int G = group_weights(FORMAT), U = unit_weights(FORMAT);
    if (staged_format(FORMAT)) {
        struct kq_staged s;
        for (int64_t b = 0; b < k / G; b++) {
            kq_stage(row + b * group_bytes(FORMAT), FORMAT, &s);
            for (int c = 0; c < G / 16; c++)
                _mm512_storeu_ps(out + b * G + 16 * c, staged16(&s, c, FORMAT));
        }
        return;
    }
    float sc[16] __attribute__((aligned(64)));
    for (int64_t b = 0; b < k / G; b++) {
        const uint8_t *blk = row + b * group_bytes(FORMAT);
        group_scales(blk, FORMAT, sc);
        for (int u = 0; u < group_units(FORMAT); u++) {
            __m512 w[4];
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

/* RR weight rows x MM rows of x for a staged format: each row's group staged once, then
 * its 16-weight vectors built as the FMAs take them. */
AVX512_TARGET INLINE void small_staged(const uint8_t *w, int64_t row_bytes, const float *x,
                                       int64_t k, float *y, int64_t ldy, const int FORMAT,
                                       const int RR, const int MM)
{
    const int G = group_weights(FORMAT), bytes = group_bytes(FORMAT);
    struct kq_staged s[4];
    __m512 acc[4][8];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            for (int line = 0; line < bytes; line += 64)
                QBLOCK_PREFETCH_AHEAD(blk + line);
            kq_stage(blk, FORMAT, &s[r]);
        }
        for (int c = 0; c < G / 16; c++) {
            const float *xc = x + b * G + 16 * c;
            for (int r = 0; r < RR; r++) {
                const __m512 wv = staged16(&s[r], c, FORMAT);
                for (int i = 0; i < MM; i++)
                    acc[r][i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xc + i * k), acc[r][i]);
            }
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

/* RR weight rows x MM rows of x: RR * MM <= 16 accumulators. A row's unit is built and used
 * before the next row's, so that its weights need only unit_weights / 16 registers. */
AVX512_TARGET INLINE void small(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                                float *y, int64_t ldy, const int FORMAT, const int RR, const int MM)
{
    if (staged_format(FORMAT)) {
        small_staged(w, row_bytes, x, k, y, ldy, FORMAT, RR, MM);
        return;
    }
    const int G = group_weights(FORMAT), U = unit_weights(FORMAT), bytes = group_bytes(FORMAT);
    float sc[4][16] __attribute__((aligned(64)));
    __m512 acc[4][8];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / G; b++) {
        for (int r = 0; r < RR; r++) {
            const uint8_t *blk = w + r * row_bytes + b * bytes;
            /* The weights 16 KB on (qblock_prefetch.h), a line of 64 bytes at a time: a
             * super-block spans three or four. */
            for (int line = 0; line < bytes; line += 64)
                QBLOCK_PREFETCH_AHEAD(blk + line);
            group_scales(blk, FORMAT, sc[r]);
        }
        for (int u = 0; u < group_units(FORMAT); u++) {
            const float *xu = x + b * G + u * U;
            /* One row of x: its unit in registers, loaded once for the RR rows. */
            __m512 xv[4] = {0};
            if (MM == 1)
                for (int c = 0; c < U / 16; c++)
                    xv[c] = _mm512_loadu_ps(xu + 16 * c);
            for (int r = 0; r < RR; r++) {
                __m512 wv[4];
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

#define SMALL_CASES(FORMAT) QBLOCK_SMALL_CASES(small, FORMAT)

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
