/* The float tiles: a panel's weight rows, already unpacked into float32 (by whichever
 * format's dequantizer), times rows of x, for every format alike.
 *
 * A tile is at most 4 weight rows; every row of x is multiplied by them in register
 * blocks (4 x 4 with AVX-512, 2 x 4 with AVX2), so that a tile's weights (at most
 * 24 KB at K = 1536) stay in L1 across the rows of x and each weight load feeds several
 * FMAs. Only the order of the sums differs from torch's matmul: the plain C loop
 * vectorizes through `omp simd reduction`, since the file is built without -ffast-math
 * and with -ffp-contract=off.
 */
#include <stdint.h>

#include <immintrin.h>

#include "qblock_gemm.h"
#include "qblock_tiles.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* ---- plain C ------------------------------------------------------------------ */

static void tile_plain(const float *w, int64_t rows, const float *x, int64_t m_count, int64_t k,
                       float *y, int64_t ldy)
{
    for (int64_t i = 0; i < m_count; i++)
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = w + r * k, *xi = x + i * k;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < k; j++)
                acc += wr[j] * xi[j];
            y[i * ldy + r] = acc;
        }
}

/* ---- AVX2 --------------------------------------------------------------------- */

AVX2_TARGET INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* RR weight rows x MM rows of x, both constants after inlining: 2 x 4 accumulators. */
AVX2_TARGET INLINE void block_avx2(const float *w, const float *x, int64_t k, float *y,
                                   int64_t ldy, const int RR, const int MM)
{
    __m256 acc[2][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j += 8) {
        __m256 wv[2];
        for (int r = 0; r < RR; r++)
            wv[r] = _mm256_loadu_ps(w + r * k + j);
        for (int i = 0; i < MM; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * k + j);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = hsum256(acc[r][i]);
}

AVX2_TARGET static void tile_avx2(const float *w, int64_t rows, const float *x, int64_t m_count,
                                  int64_t k, float *y, int64_t ldy)
{
    for (int64_t r = 0; r < rows; r += 2) {
        int two = rows - r >= 2;
        int64_t i = 0;
        for (; i + 4 <= m_count; i += 4)
            two ? block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 2, 4)
                : block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 4);
        for (; i < m_count; i++)
            two ? block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 2, 1)
                : block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 1);
    }
}

/* ---- AVX-512 ------------------------------------------------------------------ */

/* RR weight rows x MM rows of x: up to 16 accumulators, 4 weight and 1 x register. */
AVX512_TARGET INLINE void block_avx512(const float *w, const float *x, int64_t k, float *y,
                                       int64_t ldy, const int RR, const int MM)
{
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 16) {
        __m512 wv[4];
        for (int r = 0; r < RR; r++)
            wv[r] = _mm512_loadu_ps(w + r * k + j);
        for (int i = 0; i < MM; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * k + j);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

AVX512_TARGET static void tile_avx512(const float *w, int64_t rows, const float *x,
                                      int64_t m_count, int64_t k, float *y, int64_t ldy)
{
    if (rows == 4) {
        int64_t i = 0;
        for (; i + 4 <= m_count; i += 4)
            block_avx512(w, x + i * k, k, y + i * ldy, ldy, 4, 4);
        for (; i < m_count; i++)
            block_avx512(w, x + i * k, k, y + i * ldy, ldy, 4, 1);
        return;
    }
    for (int64_t r = 0; r < rows; r++) /* a last, partial tile */
        for (int64_t i = 0; i < m_count; i++)
            block_avx512(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 1);
}

void qblock_tile(int variant, const float *w, int64_t rows, const float *x, int64_t m_count,
                 int64_t k, float *y, int64_t ldy)
{
    if (variant == QBLOCK_VARIANT_AVX512)
        tile_avx512(w, rows, x, m_count, k, y, ldy);
    else if (variant == QBLOCK_VARIANT_AVX2)
        tile_avx2(w, rows, x, m_count, k, y, ldy);
    else
        tile_plain(w, rows, x, m_count, k, y, ldy);
}
