/* F16 and BF16 rows (qblock_float16.h) widened to float32, per variant: into a panel
 * buffer that qblock_tiles.c's float tiles multiply (any M), or, at small M, into
 * registers that the FMAs use at once, as the quantized formats do. The products are
 * float32 weights (exact) times float32 activations: a BF16 weight is never multiplied
 * by an activation rounded to bf16 here. Built with -ffp-contract=off: the widening is
 * exact, so only the sums' order differs from a float32 matmul. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "qblock_float16.h"
#include "qblock_half.h"
#include "qblock_prefetch.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* ---- plain C ------------------------------------------------------------------ */

void f16_dequant_plain(int format, const uint8_t *row, int64_t k, float *out)
{
    if (format == QBLOCK_FORMAT_F16) { /* the exact table qblock_gemm.c fills at load */
        for (int64_t i = 0; i < k; i++)
            out[i] = qblock_half(row + 2 * i);
        return;
    }
    for (int64_t i = 0; i < k; i++) { /* bfloat16: float32's top 16 bits */
        uint32_t bits = (uint32_t)qblock_load_u16(row + 2 * i) << 16;
        memcpy(out + i, &bits, sizeof bits);
    }
}

/* ---- AVX2 (F16C for F16) ------------------------------------------------------ */

AVX2_TARGET INLINE __m256 widen8_avx2(const uint8_t *p, const int FORMAT)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (FORMAT == QBLOCK_FORMAT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AVX2_TARGET void f16_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out)
{
    if (format == QBLOCK_FORMAT_F16)
        for (int64_t i = 0; i < k; i += 8)
            _mm256_storeu_ps(out + i, widen8_avx2(row + 2 * i, QBLOCK_FORMAT_F16));
    else
        for (int64_t i = 0; i < k; i += 8)
            _mm256_storeu_ps(out + i, widen8_avx2(row + 2 * i, QBLOCK_FORMAT_BF16));
}

/* RR weight rows x MM rows of x, 8 weights a step: RR * MM <= 8 accumulators, so that
 * they, the weights and a row of x fit AVX2's 16 registers. */
AVX2_TARGET INLINE void small_avx2(const uint8_t *w, int64_t row_bytes, const float *x, int64_t k,
                                   float *y, int64_t ldy, const int FORMAT, const int RR,
                                   const int MM)
{
    __m256 acc[4][2];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j += 8) {
        if (j % 32 == 0) /* a line (32 weights) at a time, 16 KB on (qblock_prefetch.h) */
            for (int r = 0; r < RR; r++)
                QBLOCK_PREFETCH_AHEAD(w + r * row_bytes + 2 * j);
        __m256 wv[4];
        for (int r = 0; r < RR; r++)
            wv[r] = widen8_avx2(w + r * row_bytes + 2 * j, FORMAT);
        for (int i = 0; i < MM; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * k + j);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[r][i]), _mm256_extractf128_ps(acc[r][i], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y[i * ldy + r] = _mm_cvtss_f32(s);
        }
}

AVX2_TARGET INLINE void small_tile_avx2(const uint8_t *w, int64_t row_bytes, int64_t rows,
                                        const float *x, int64_t m_count, int64_t k, float *y,
                                        int64_t ldy, const int FORMAT)
{
    if (rows != 4) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < m_count; i++)
                small_avx2(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy,
                           FORMAT, 1, 1);
        return;
    }
    int64_t i = 0;
    for (; i + 2 <= m_count; i += 2)
        small_avx2(w, row_bytes, x + i * k, k, y + i * ldy, ldy, FORMAT, 4, 2);
    if (i < m_count)
        small_avx2(w, row_bytes, x + i * k, k, y + i * ldy, ldy, FORMAT, 4, 1);
}

AVX2_TARGET void f16_small_tile_avx2(int format, const uint8_t *w, int64_t row_bytes,
                                     int64_t rows, const float *x, int64_t m_count, int64_t k,
                                     float *y, int64_t ldy)
{
    if (format == QBLOCK_FORMAT_F16)
        small_tile_avx2(w, row_bytes, rows, x, m_count, k, y, ldy, QBLOCK_FORMAT_F16);
    else
        small_tile_avx2(w, row_bytes, rows, x, m_count, k, y, ldy, QBLOCK_FORMAT_BF16);
}

/* ---- AVX-512 ------------------------------------------------------------------ */

AVX512_TARGET INLINE __m512 widen16_avx512(const uint8_t *p, const int FORMAT)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (FORMAT == QBLOCK_FORMAT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512_TARGET void f16_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out)
{
    if (format == QBLOCK_FORMAT_F16)
        for (int64_t i = 0; i < k; i += 16)
            _mm512_storeu_ps(out + i, widen16_avx512(row + 2 * i, QBLOCK_FORMAT_F16));
    else
        for (int64_t i = 0; i < k; i += 16)
            _mm512_storeu_ps(out + i, widen16_avx512(row + 2 * i, QBLOCK_FORMAT_BF16));
}

/* RR weight rows x MM rows of x: up to 16 accumulators, 16 weights a step. */
AVX512_TARGET INLINE void small_avx512(const uint8_t *w, int64_t row_bytes, const float *x,
                                       int64_t k, float *y, int64_t ldy, const int FORMAT,
                                       const int RR, const int MM)
{
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 32) {
        /* The weights 16 KB on, a line (32 weights) at a time, as the quantized
         * formats' small tiles fetch theirs (qblock_prefetch.h). */
        for (int r = 0; r < RR; r++)
            QBLOCK_PREFETCH_AHEAD(w + r * row_bytes + 2 * j);
#pragma GCC unroll 2
        for (int c = 0; c < 32; c += 16) {
            __m512 wv[4];
            for (int r = 0; r < RR; r++)
                wv[r] = widen16_avx512(w + r * row_bytes + 2 * (j + c), FORMAT);
            for (int i = 0; i < MM; i++) {
                __m512 xv = _mm512_loadu_ps(x + i * k + j + c);
                for (int r = 0; r < RR; r++)
                    acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#define SMALL_CASES(FORMAT)                                                                    \
    switch (m_count * 8 + (rows == 4 ? 4 : 1)) {                                               \
    case 12: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1); break;                    \
    case 20: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2); break;                    \
    case 28: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 3); break;                    \
    case 36: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 4); break;                    \
    default:                                                                                   \
        for (int64_t r = 0; r < rows; r++)                                                     \
            for (int64_t i = 0; i < m_count; i++)                                              \
                small_avx512(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy, \
                             FORMAT, 1, 1);                                                    \
    }

AVX512_TARGET void f16_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes,
                                         int64_t rows, const float *x, int64_t m_count,
                                         int64_t k, float *y, int64_t ldy)
{
    if (format == QBLOCK_FORMAT_F16) {
        SMALL_CASES(QBLOCK_FORMAT_F16)
    } else {
        SMALL_CASES(QBLOCK_FORMAT_BF16)
    }
}
