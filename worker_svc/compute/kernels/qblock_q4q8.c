/* Q4_1 and Q8_0, the blocks of 32 weights GGUF's own files use (the shipped model's
 * projections and its LM head), unpacked into float32 per variant:
 *   Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; byte j holds weight j in its
 *        low nibble and weight j + 16 in its high one; w = d * q + m.
 *   Q8_0 (34 bytes): f16 d, 32 int8; w = d * q.
 * Each weight is the value gguf's dequantizer computes (float32 d * q, then + m). d has
 * 11 significant bits and q at most 8, so d * q is exact in float32 and fma(d, q, m)
 * rounds once, as the separate add does: the vector variants may fuse it (and Q4_1's
 * AVX-512 path reads its 16 possible values from a table made by one FMA a block).
 *
 * Two ways out: a row into a panel buffer (q4q8_dequant_*), which the float tiles
 * (qblock_tiles.c) then multiply, and, at small M on AVX-512, straight into registers
 * that the FMAs use at once (q4q8_small_tile_avx512). The K-quant formats have the same
 * two, in qblock_kquants*.c; qblock_gemm.c picks between them. Built with
 * -ffp-contract=off: fusing is this file's choice where it is exact, never the compiler's.
 */
#include <stdint.h>

#include <immintrin.h>

#include "qblock_half.h"
#include "qblock_prefetch.h"
#include "qblock_q4q8.h"
#include "qblock_small_cases.h"

enum { FORMAT_Q4_1 = QBLOCK_FORMAT_Q4_1, FORMAT_Q8_0 = QBLOCK_FORMAT_Q8_0 };
enum { Q4_1_BYTES = QBLOCK_Q4_1_BYTES, Q8_0_BYTES = QBLOCK_Q8_0_BYTES, QK = 32 };

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

INLINE float half_value(const uint8_t *p)
{
    return qblock_half(p);
}

/* ---- plain C ------------------------------------------------------------------ */

void q4q8_dequant_plain(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            float d = qblock_half_to_float(qblock_load_u16(blk));
            float m = qblock_half_to_float(qblock_load_u16(blk + 2));
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(blk[4 + j] & 0x0f) + m;
                out[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
            }
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            float d = qblock_half_to_float(qblock_load_u16(blk));
            for (int j = 0; j < QK; j++)
                out[j] = d * (float)(int8_t)blk[2 + j];
        }
    }
}

/* ---- AVX2 --------------------------------------------------------------------- */

AVX2_TARGET void q4q8_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            __m256 d = _mm256_set1_ps(half_value(blk));
            __m256 m = _mm256_set1_ps(half_value(blk + 2));
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 4));
            __m256i lo8 = _mm256_cvtepu8_epi32(q), hi8 = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
            __m256i nib = _mm256_set1_epi32(0x0f);
            __m256i parts[4] = {_mm256_and_si256(lo8, nib), _mm256_and_si256(hi8, nib),
                                _mm256_srli_epi32(lo8, 4), _mm256_srli_epi32(hi8, 4)};
            for (int p = 0; p < 4; p++)
                _mm256_storeu_ps(out + 8 * p, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(parts[p]), m));
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            __m256 d = _mm256_set1_ps(half_value(blk));
            for (int p = 0; p < 4; p++) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * p)));
                _mm256_storeu_ps(out + 8 * p, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
    }
}

/* ---- AVX-512 ------------------------------------------------------------------ */

/* A Q4_1 block's 32 weights: its 16 possible values d * q + m (one FMA over 0..15),
 * picked by each nibble (vpermps reads only an index's low 4 bits: no mask needed). */
AVX512_TARGET INLINE void q4_1_regs_avx512(const uint8_t *blk, __m512 *lo, __m512 *hi)
{
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(half_value(blk)), levels,
                                   _mm512_set1_ps(half_value(blk + 2)));
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
    *lo = _mm512_permutexvar_ps(q, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}

AVX512_TARGET void q4q8_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            __m512 lo, hi;
            q4_1_regs_avx512(blk, &lo, &hi);
            _mm512_storeu_ps(out, lo);
            _mm512_storeu_ps(out + 16, hi);
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            __m512 d = _mm512_set1_ps(half_value(blk));
            for (int p = 0; p < 2; p++) {
                __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * p)));
                _mm512_storeu_ps(out + 16 * p, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
            }
        }
    }
}

/* Small M (a decode of a few sequences): no buffer. Each block of RR rows is
 * dequantized into registers and used at once by the MM rows of x, so the weights go
 * from memory to the FMAs without a store and a reload. */
AVX512_TARGET INLINE void block_regs_avx512(const uint8_t *blk, const int FORMAT, __m512 *lo,
                                            __m512 *hi)
{
    if (FORMAT == FORMAT_Q4_1) {
        q4_1_regs_avx512(blk, lo, hi);
    } else {
        __m512 d = _mm512_set1_ps(half_value(blk));
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(
                                   _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(
                                   _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
    }
}

AVX512_TARGET INLINE void small_avx512(const uint8_t *w, int64_t row_bytes, const float *x,
                                       int64_t k, float *y, int64_t ldy, const int FORMAT,
                                       const int RR, const int MM)
{
    const int bytes = FORMAT == FORMAT_Q4_1 ? Q4_1_BYTES : Q8_0_BYTES;
    __m512 acc[4][8]; /* RR * MM <= 16 in use: the rest of the 32 registers hold lo, hi, x */
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK; b++) {
        __m512 lo[4], hi[4];
        for (int r = 0; r < RR; r++) {
            /* The weights 16 KB on (qblock_prefetch.h), a block at a time. */
            QBLOCK_PREFETCH_AHEAD(w + r * row_bytes + b * bytes);
            block_regs_avx512(w + r * row_bytes + b * bytes, FORMAT, &lo[r], &hi[r]);
        }
        for (int i = 0; i < MM; i++) {
            __m512 x0 = _mm512_loadu_ps(x + i * k + b * QK), x1 = _mm512_loadu_ps(x + i * k + b * QK + 16);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm512_fmadd_ps(hi[r], x1, _mm512_fmadd_ps(lo[r], x0, acc[r][i]));
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#define SMALL_CASES(FORMAT) QBLOCK_SMALL_CASES(small_avx512, FORMAT)

/* rows <= 4 weight rows times m_count <= Q4Q8_SMALL_M rows of x. */
AVX512_TARGET void q4q8_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes,
                                          int64_t rows, const float *x, int64_t m_count,
                                          int64_t k, float *y, int64_t ldy)
{
    if (format == FORMAT_Q4_1) {
        SMALL_CASES(FORMAT_Q4_1)
    } else {
        SMALL_CASES(FORMAT_Q8_0)
    }
}
