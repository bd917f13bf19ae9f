/* y[M, N] = x[M, K] @ W[N, K]^T for large M, W in Q4_1, Q8_0 or MXFP4 blocks, in integer dot
 * products (AVX-512 VNNI's vpdpwssd): llama.cpp's block arithmetic, 16-bit activations.
 * The K-quant formats and Q5_0 pack their panels in qblock_kquants_vnni.c (linked with
 * this file) and share the rest.
 *
 * x is quantized per row in blocks of 32: dx = max|x| / 32767, qx = round(x / dx) in
 * int16, sx = dx * sum(qx). A block's dot product is then exact integer work plus two
 * scalings:  sum_j (d q_j + m) x_j ~= d dx sum_j q_j qx_j + m sx   (Q8_0: m = 0, q signed;
 * MXFP4: m = 0, q its codes' integers, d the block's power of two: qblock_mxfp4.h).
 * Why 16 bits, not llama.cpp's 8 (Q8_1, vpdpbusd, twice the products an instruction):
 * with 8-bit blocks the prefill of "What is the capital of France?" already turned
 * SmolLM2-135M's reply to French nonsense, as the int8 path's did; 16-bit activations
 * are float32's to ~1e-5 and still twice float32's FMAs per instruction.
 *
 * Layout: output rows in panels of 16, one per 32-bit lane. A panel's blocks are packed
 * once per call (qblock_vnni_pack.h) so that 2 consecutive k of its 16 rows form one
 * 64-byte vector of int16; each row of x then broadcasts 2 of its int16 values against
 * it (vpdpwssd: 2 products a lane). The int32 sums are scaled to float once per block.
 * Rows of x go 8 at a time, so each weight vector is loaded once for 8 rows.
 */
#include <stdint.h>
#include <stdlib.h>

#include <immintrin.h>

#include "qblock_gemm.h"
#include "qblock_kquants.h"
#include "qblock_mxfp4.h"
#include "qblock_vnni.h"
#include "qblock_vnni_pack.h"
#include "qblock_vnni_transpose.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { QK = 32, LANES = 16, ROWS = 8 };
enum { FORMAT_Q4_1 = 0, FORMAT_Q8_0 = 1, FORMAT_MXFP4 = QBLOCK_FORMAT_MXFP4 };
_Static_assert((int)FORMAT_Q4_1 == (int)VNNI_PACK_Q4_1 && (int)FORMAT_Q8_0 == (int)VNNI_PACK_Q8_0,
               "the packer's format codes");

int qblock_vnni_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* Row i of x -> qx[K] int16, dx[K/32], sx[K/32]. */
VNNI_TARGET static void quantize_row(const float *x, int64_t k, int16_t *qx, float *dx, float *sx)
{
    for (int64_t b = 0; b < k / QK; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * QK), v1 = _mm512_loadu_ps(x + b * QK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
        _mm256_storeu_si256((__m256i *)(qx + b * QK), _mm512_cvtsepi32_epi16(q0));
        _mm256_storeu_si256((__m256i *)(qx + b * QK + 16), _mm512_cvtsepi32_epi16(q1));
        dx[b] = d;
        sx[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

/* The Q4_1 / Q8_0 / MXFP4 packer (qblock_vnni_pack.h), exported for its test. */
VNNI_TARGET void qblock_vnni_pack_panel(int format, const uint8_t *w, int64_t row_bytes,
                                        int64_t rows, int64_t k, int16_t *wq, float *wd, float *wm)
{
    vnni_pack_panel(format, w, row_bytes, rows, k, wq, wd, wm);
}

/* The packers' transpose (qblock_vnni_transpose.h), exported for its test. */
VNNI_TARGET void qblock_vnni_transpose_panel(const int16_t *tmp, int64_t k, int16_t *wq)
{
    vnni_transpose_panel(tmp, k, wq);
}

/* acc += wv . (the int16 pair at `pair`, broadcast to every lane): vpdpwssd with the pair
 * as an embedded broadcast. Written in asm because GCC 12 compiles the intrinsic
 * (_mm512_dpwssd_epi32 with _mm512_set1_epi32) into a separate vpbroadcastd and two
 * register copies around every product in panel_rows' loop, which left the loop at
 * about half of vpdpwssd's rate. */
#define DPWSSD_BROADCAST(acc, wv, pair) \
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wv), "m"(*(const int32_t *)(pair)))

/* MM rows of x (a constant after inlining) against one packed panel. */
VNNI_TARGET INLINE void panel_rows(const int16_t *wq, const float *wd, const float *wm,
                                   const int16_t *qx, const float *dx, const float *sx,
                                   int64_t k, float *y, int64_t ldy, int64_t rows, const int MM)
{
    const int64_t blocks = k / QK;
    __m512 acc[ROWS];
    for (int i = 0; i < MM; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        __m512i dot[ROWS];
        for (int i = 0; i < MM; i++)
            dot[i] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int s = 0; s < QK / 2; s++) {
            __m512i wv = _mm512_loadu_si512(wq + (b * (QK / 2) + s) * 32);
            for (int i = 0; i < MM; i++)
                DPWSSD_BROADCAST(dot[i], wv, qx + i * k + b * QK + 2 * s);
        }
        __m512 d = _mm512_loadu_ps(wd + b * LANES), m = _mm512_loadu_ps(wm + b * LANES);
        for (int i = 0; i < MM; i++) {
            __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(dx[i * blocks + b]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), scale, acc[i]);
            acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[i * blocks + b]), acc[i]);
        }
    }
    __mmask16 keep = (__mmask16)((1u << rows) - 1u);
    for (int i = 0; i < MM; i++)
        _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

VNNI_TARGET void qblock_vnni_quantize_rows(const float *x, int64_t m, int64_t k, int16_t *qx,
                                           float *dx, float *sx)
{
    for (int64_t i = 0; i < m; i++)
        quantize_row(x + i * k, k, qx + i * k, dx + i * (k / QK), sx + i * (k / QK));
}

VNNI_TARGET void qblock_vnni_panel(int format, const uint8_t *w, int64_t first, int64_t rows,
                                   int64_t k, const int16_t *qx, const float *dx, const float *sx,
                                   int64_t m, float *y, int64_t ldy, int16_t *tmp, float *wd)
{
    if (kq_is_kquant_format(format)) { /* their packing: qblock_kquants_vnni.c */
        kq_vnni_panel(format, w, first, rows, k, qx, dx, sx, m, y, ldy, tmp, wd);
        return;
    }
    const int64_t blocks = k / QK;
    const int64_t row_bytes = qblock_row_bytes(format, k);
    int16_t *wq = tmp + LANES * k;
    float *wm = wd + LANES * blocks;
    vnni_pack_panel(format, w + first * row_bytes, row_bytes, rows, k, wq, wd, wm);
    int64_t i = 0;
    for (; i + ROWS <= m; i += ROWS)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * blocks, sx + i * blocks, k,
                   y + i * ldy + first, ldy, rows, ROWS);
    for (; i < m; i++)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * blocks, sx + i * blocks, k,
                   y + i * ldy + first, ldy, rows, 1);
}

VNNI_TARGET static int gemm(int format, const uint8_t *w, const float *x, float *y, int64_t m_count,
                            int64_t n, int64_t k, int threads)
{
    const int64_t blocks = k / QK;
    int16_t *qx = malloc(sizeof(int16_t) * m_count * k);
    float *dx = malloc(sizeof(float) * m_count * blocks), *sx = malloc(sizeof(float) * m_count * blocks);
    if (!qx || !dx || !sx) {
        free(qx), free(dx), free(sx);
        return -3;
    }
    int failed = 0;
    const int64_t panels = (n + LANES - 1) / LANES;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m_count; i++)
            quantize_row(x + i * k, k, qx + i * k, dx + i * blocks, sx + i * blocks);
        int16_t *tmp = aligned_alloc(64, sizeof(int16_t) * 2 * LANES * k);
        float *wd = aligned_alloc(64, sizeof(float) * LANES * blocks * 2);
        if (!tmp || !wd) {
#pragma omp atomic write
            failed = 1;
        }
        /* Dynamic: a thread that loses its core on a shared machine hands on its panels. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < panels; p++) {
            if (!tmp || !wd)
                continue;
            int64_t rows = n - p * LANES < LANES ? n - p * LANES : LANES;
            qblock_vnni_panel(format, w, p * LANES, rows, k, qx, dx, sx, m_count, y, n, tmp, wd);
        }
        free(tmp);
        free(wd);
    }
    free(qx), free(dx), free(sx);
    return failed ? -3 : 0;
}

/* Returns 0; -1 without VNNI, -2 for a K not a multiple of 32, -3 out of memory. No
 * AVX-512 instruction runs before the CPU is checked. */
int qblock_vnni_gemm(int format, const uint8_t *w, const float *x, float *y, int64_t m_count,
                     int64_t n, int64_t k, int threads)
{
    if (!qblock_vnni_supported())
        return -1;
    const int kquant = kq_is_kquant_format(format);
    const int reads = format == FORMAT_Q4_1 || format == FORMAT_Q8_0 || format == FORMAT_MXFP4;
    if ((!reads && !kquant) ||
        k % (kquant ? kq_group_weights(format) : QK) != 0)
        return -2;
    return gemm(format, w, x, y, m_count, n, k, threads);
}
