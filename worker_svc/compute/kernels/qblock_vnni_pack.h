/* qblock_vnni.c's panel packing for Q4_1, Q8_0 and MXFP4: 16 rows of blocks straight into
 * the layout its vpdpwssd reads (wq[K / 2][16][2] int16: vector k2 holds every row's pair
 * of weights 2 k2, 2 k2 + 1), without the widened copy and 32-bit transpose the other
 * packers take (qblock_vnni_transpose.h).
 *
 * Why it works on the stored bytes: a pair of weights is one 16-bit word of the block's
 * data. Q8_0's pair s is its word s; Q4_1's and MXFP4's pair s < 8 is the low nibbles of
 * word s and pair s + 8 the high nibbles of the same word (byte j holds weight j low,
 * j + 16 high). So a block's 16-byte chunk of 16 rows is transposed as 16-bit words (two
 * rounds of vpermt2w), then each word vector is split into nibbles (or taken as int8)
 * and widened (vpmovzxbw / vpmovsxbw) to two pairs' vectors. The packed panel is the
 * same as the widen-and-transpose one, so the products are the same.
 *
 * Measured on a 2-vCPU Zen 4 VM against the widen-and-transpose packing, builds
 * alternated (noisy; indicative): packing alone ~30% faster on the default model's Q4_1
 * projections at M = 64; the decode step at batch 64 (bench.micro.step_compare, 7 pairs)
 * 90.7 against 98.2 ms median; cbserve bench roofline's q4_1 row (weights hot in cache,
 * the loop bound by its per-block float scaling) within its noise.
 */
#ifndef CBSERVE_QBLOCK_VNNI_PACK_H
#define CBSERVE_QBLOCK_VNNI_PACK_H

#include <stdint.h>

#include <immintrin.h>

#include "qblock_mxfp4.h"
#include "qblock_q4q8.h"

#define VNNI_PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

enum { VNNI_PACK_LANES = 16, VNNI_PACK_QK = 32 };
enum { VNNI_PACK_Q4_1 = 0, VNNI_PACK_Q8_0 = 1 }; /* else MXFP4 (the callers' formats) */

/* Round 1 (per 8 rows, q: words 4q .. 4q + 3): word t' of row r' at 8 t' + r', from two
 * vectors of 4 rows' chunks each (row r' < 4 at word 8 r', the rest 32 words on). */
#define VNNI_PACK_R1(t) t, 8 + t, 16 + t, 24 + t, 32 + t, 40 + t, 48 + t, 56 + t
/* Round 2: word t' of rows 0 .. 7 from the first vector, rows 8 .. 15 from the second. */
#define VNNI_PACK_R2(t)                                                                    \
    8 * t, 8 * t + 1, 8 * t + 2, 8 * t + 3, 8 * t + 4, 8 * t + 5, 8 * t + 6, 8 * t + 7,     \
        32 + 8 * t, 33 + 8 * t, 34 + 8 * t, 35 + 8 * t, 36 + 8 * t, 37 + 8 * t, 38 + 8 * t, \
        39 + 8 * t

static const uint16_t vnni_pack_round1[2][32] = {
    {VNNI_PACK_R1(0), VNNI_PACK_R1(1), VNNI_PACK_R1(2), VNNI_PACK_R1(3)},
    {VNNI_PACK_R1(4), VNNI_PACK_R1(5), VNNI_PACK_R1(6), VNNI_PACK_R1(7)},
};
static const uint16_t vnni_pack_round2[2][32] = {
    {VNNI_PACK_R2(0), VNNI_PACK_R2(1)},
    {VNNI_PACK_R2(2), VNNI_PACK_R2(3)},
};

/* chunk[r]: row r's 16 bytes -> a[g]: rows 4g .. 4g + 3, one a 128-bit lane. */
VNNI_PACK_TARGET static inline void vnni_pack_load(const uint8_t *const chunk[16], __m512i a[4])
{
    for (int g = 0; g < 4; g++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)chunk[4 * g]));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)chunk[4 * g + 1]), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)chunk[4 * g + 2]), 2);
        a[g] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)chunk[4 * g + 3]), 3);
    }
}

/* The first 32-bit word of each row's block (head[r]), row r in lane r: Q4_1's f16 d and
 * m, Q8_0's d in its low half. Loaded as the chunks are: a gather took a quarter of the
 * packing's time on Zen 4, 16 scalar stores read back as one vector stalled as long. */
VNNI_PACK_TARGET static inline __m512i vnni_pack_heads(const uint8_t *const head[16])
{
    __m512i a[4];
    vnni_pack_load(head, a);
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i lo = _mm512_permutex2var_epi32(a[0], first, a[1]);
    const __m512i hi = _mm512_permutex2var_epi32(a[2], first, a[3]);
    return _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
}

/* chunk[r]: row r's 16 bytes -> p[j]: 16-bit word 2j of rows 0 .. 15 in the low 256
 * bits (row r at word r), word 2j + 1 in the high 256 bits. */
VNNI_PACK_TARGET static inline void vnni_pack_words(const uint8_t *const chunk[16], __m512i p[4])
{
    __m512i a[4], b[4];
    vnni_pack_load(chunk, a);
    for (int h = 0; h < 2; h++) /* b[2h + q]: rows 8h .. 8h + 7, words 4q .. 4q + 3 */
        for (int q = 0; q < 2; q++)
            b[2 * h + q] = _mm512_permutex2var_epi16(
                a[2 * h], _mm512_loadu_si512(vnni_pack_round1[q]), a[2 * h + 1]);
    for (int j = 0; j < 4; j++)
        p[j] = _mm512_permutex2var_epi16(b[j / 2], _mm512_loadu_si512(vnni_pack_round2[j % 2]),
                                         b[2 + j / 2]);
}

/* The two pairs' vectors of p's 32 bytes (16 rows x 2 weights, each half), widened. */
VNNI_PACK_TARGET static inline void vnni_pack_store(__m512i bytes, int is_signed, int16_t *lo,
                                                    int16_t *hi)
{
    const __m256i l = _mm512_castsi512_si256(bytes), h = _mm512_extracti64x4_epi64(bytes, 1);
    _mm512_storeu_si512(lo, is_signed ? _mm512_cvtepi8_epi16(l) : _mm512_cvtepu8_epi16(l));
    _mm512_storeu_si512(hi, is_signed ? _mm512_cvtepi8_epi16(h) : _mm512_cvtepu8_epi16(h));
}

/* Rows (<= 16; missing ones are zeros) of `format` blocks -> wq[K / 2][16][2] int16 and
 * wd / wm[K / 32][16] floats (their scales and minimums; 0 where a format has none). */
VNNI_PACK_TARGET static inline void vnni_pack_panel(int format, const uint8_t *w, int64_t row_bytes,
                                                    int64_t rows, int64_t k, int16_t *wq,
                                                    float *wd, float *wm)
{
    static const uint8_t zeros[16] = {0};
    static const int8_t mxfp4_codes[16] = QBLOCK_MXFP4_CODES;
    const __m512i codes = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mxfp4_codes));
    const __m512i low = _mm512_set1_epi8(0x0f);
    const int64_t block_bytes = format == VNNI_PACK_Q4_1   ? QBLOCK_Q4_1_BYTES
                                : format == VNNI_PACK_Q8_0 ? QBLOCK_Q8_0_BYTES
                                                           : QBLOCK_MXFP4_BYTES;
    /* This panel's bytes and the next one's into L2 in address order first: the packing
     * reads 16 rows a block at a time, 16 streams the hardware prefetcher did not keep up
     * with (the default model's Q8_0 head at M = 64, its weight read from memory, took
     * ~10% longer than with the row-by-row packing without this, ~8% less with it; the
     * next panel alone or this one alone gave about the same). Past a weight's end a
     * prefetch never faults. */
    for (int64_t at = 0; at < 2 * VNNI_PACK_LANES * row_bytes; at += 64)
        __builtin_prefetch(w + at, 0, 2);
    for (int64_t b = 0; b < k / VNNI_PACK_QK; b++) {
        const uint8_t *blk[16], *chunk[16];
        for (int r = 0; r < VNNI_PACK_LANES; r++)
            blk[r] = r < rows ? w + r * row_bytes + b * block_bytes : NULL;
        int16_t *out = wq + b * VNNI_PACK_QK * VNNI_PACK_LANES; /* 16 pair vectors a block */
        float *d = wd + b * VNNI_PACK_LANES, *m = wm + b * VNNI_PACK_LANES;
        __m512i p[4];
        /* Q4_1's and Q8_0's scales lead their blocks; MXFP4's is one e8m0 byte (below). */
        for (int r = 0; r < VNNI_PACK_LANES; r++)
            chunk[r] = blk[r] ? blk[r] : zeros;
        const int q4_1 = format == VNNI_PACK_Q4_1;
        const __m512i head = q4_1 || format == VNNI_PACK_Q8_0 ? vnni_pack_heads(chunk)
                                                              : _mm512_setzero_si512();
        if (format == VNNI_PACK_Q8_0) {
            _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
            _mm512_storeu_ps(m, _mm512_setzero_ps());
            for (int c = 0; c < 2; c++) { /* pairs 8c .. 8c + 7 */
                for (int r = 0; r < VNNI_PACK_LANES; r++)
                    chunk[r] = blk[r] ? blk[r] + 2 + 16 * c : zeros;
                vnni_pack_words(chunk, p);
                for (int j = 0; j < 4; j++) {
                    int16_t *pair = out + (8 * c + 2 * j) * 32;
                    vnni_pack_store(p[j], 1, pair, pair + 32);
                }
            }
            continue;
        }
        if (q4_1) { /* f16 d and m side by side */
            _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
            const __m512i minimums = _mm512_srli_epi32(head, 16);
            _mm512_storeu_ps(m, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(minimums)));
        } else {
            for (int r = 0; r < VNNI_PACK_LANES; r++)
                d[r] = blk[r] ? qblock_e8m0_values[blk[r][0]] : 0.0f, m[r] = 0.0f;
        }
        for (int r = 0; r < VNNI_PACK_LANES; r++)
            chunk[r] = blk[r] ? blk[r] + (q4_1 ? 4 : 1) : zeros;
        vnni_pack_words(chunk, p);
        for (int j = 0; j < 4; j++) { /* word t: pair t's low nibbles, pair t + 8's high */
            __m512i lo = _mm512_and_si512(p[j], low);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p[j], 4), low);
            if (!q4_1)
                lo = _mm512_shuffle_epi8(codes, lo), hi = _mm512_shuffle_epi8(codes, hi);
            vnni_pack_store(lo, !q4_1, out + 2 * j * 32, out + (2 * j + 1) * 32);
            vnni_pack_store(hi, !q4_1, out + (2 * j + 8) * 32, out + (2 * j + 9) * 32);
        }
    }
}

#endif
