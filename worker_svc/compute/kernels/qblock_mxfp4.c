/* MXFP4 blocks (layout: qblock_mxfp4.h) unpacked into float32 per variant, the two ways
 * out the other formats have (qblock_q4q8.c): a row into the panel buffer that the float
 * tiles multiply (mxfp4_dequant_*), and at small M on AVX-512 straight into registers
 * that the FMAs use at once (mxfp4_small_tile_avx512). The VNNI kernel packs MXFP4 panels
 * in qblock_vnni.c.
 *
 * A nibble becomes its value by a 16-entry lookup: pshufb over the 16 int8 codes (AVX2),
 * or vpermps over the block's 16 possible float values, d * code (AVX-512: one multiply
 * a block, exact, then one permute per 16 weights, as Q4_1's table there). The product
 * d * code is exact, so no variant rounds. Built with -ffp-contract=off. */
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_mxfp4.h"
#include "qblock_prefetch.h"
#include "qblock_small_cases.h"

enum { QK = 32, BYTES = QBLOCK_MXFP4_BYTES };

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

static const int8_t CODES[16] = QBLOCK_MXFP4_CODES;

float qblock_e8m0_values[256];

/* llama.cpp's ggml_e8m0_to_fp32_half: 2^(e - 128), the two smallest as subnormals. */
__attribute__((constructor)) static void fill_e8m0_values(void)
{
    for (uint32_t e = 0; e < 256; e++) {
        const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
        memcpy(&qblock_e8m0_values[e], &bits, sizeof bits);
    }
}

/* ---- plain C ------------------------------------------------------------------ */

void mxfp4_dequant_plain(const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        const uint8_t *blk = row + b * BYTES;
        const float d = qblock_e8m0_values[blk[0]];
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)CODES[blk[1 + j] & 0x0f];
            out[j + 16] = d * (float)CODES[blk[1 + j] >> 4];
        }
    }
}

/* ---- AVX2 --------------------------------------------------------------------- */

AVX2_TARGET void mxfp4_dequant_avx2(const uint8_t *row, int64_t k, float *out)
{
    const __m128i codes = _mm_loadu_si128((const __m128i *)CODES), low = _mm_set1_epi8(0x0f);
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        const uint8_t *blk = row + b * BYTES;
        const __m256 d = _mm256_set1_ps(qblock_e8m0_values[blk[0]]);
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 1));
        /* Weights 0-15 (low nibbles), then 16-31 (high ones), as int8 values. */
        const __m128i high = _mm_and_si128(_mm_srli_epi16(q, 4), low);
        const __m128i halves[2] = {_mm_shuffle_epi8(codes, _mm_and_si128(q, low)),
                                   _mm_shuffle_epi8(codes, high)};
        for (int h = 0; h < 2; h++) {
            __m256i v0 = _mm256_cvtepi8_epi32(halves[h]);
            __m256i v1 = _mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8));
            _mm256_storeu_ps(out + 16 * h, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v0)));
            _mm256_storeu_ps(out + 16 * h + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v1)));
        }
    }
}

/* ---- AVX-512 ------------------------------------------------------------------ */

/* A block's 32 weights: its 16 possible values d * code, picked by each nibble (vpermps
 * reads only an index's low 4 bits: no mask for the low nibbles). */
AVX512_TARGET INLINE void block_regs_avx512(const uint8_t *blk, __m512 codes, __m512 *lo,
                                            __m512 *hi)
{
    const __m512 table = _mm512_mul_ps(_mm512_set1_ps(qblock_e8m0_values[blk[0]]), codes);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 1)));
    *lo = _mm512_permutexvar_ps(q, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}

AVX512_TARGET INLINE __m512 codes_avx512(void)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)CODES)));
}

AVX512_TARGET void mxfp4_dequant_avx512(const uint8_t *row, int64_t k, float *out)
{
    const __m512 codes = codes_avx512();
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        __m512 lo, hi;
        block_regs_avx512(row + b * BYTES, codes, &lo, &hi);
        _mm512_storeu_ps(out, lo);
        _mm512_storeu_ps(out + 16, hi);
    }
}

/* RR weight rows times MM rows of x (constants after inlining), as qblock_q4q8.c's. */
AVX512_TARGET INLINE void small_avx512(const uint8_t *w, int64_t row_bytes, const float *x,
                                       int64_t k, float *y, int64_t ldy, const int FORMAT,
                                       const int RR, const int MM)
{
    (void)FORMAT;
    const __m512 codes = codes_avx512();
    __m512 acc[4][8]; /* RR * MM <= 16 in use */
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK; b++) {
        __m512 lo[4], hi[4];
        for (int r = 0; r < RR; r++) {
            QBLOCK_PREFETCH_AHEAD(w + r * row_bytes + b * BYTES);
            block_regs_avx512(w + r * row_bytes + b * BYTES, codes, &lo[r], &hi[r]);
        }
        for (int i = 0; i < MM; i++) {
            const float *xb = x + i * k + b * QK;
            const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm512_fmadd_ps(hi[r], x1, _mm512_fmadd_ps(lo[r], x0, acc[r][i]));
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

AVX512_TARGET void mxfp4_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes,
                                           int64_t rows, const float *x, int64_t m_count,
                                           int64_t k, float *y, int64_t ldy)
{
    (void)format;
    QBLOCK_SMALL_CASES(small_avx512, QBLOCK_FORMAT_MXFP4)
}
