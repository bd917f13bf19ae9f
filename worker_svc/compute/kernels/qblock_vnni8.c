/* y[M, N] = x[M, K] @ W[N, K]^T for W in Q4_1 blocks, with 8-bit activation blocks and
 * AVX-512 VNNI's vpdpbusd (4 products a lane, twice vpdpwssd's): llama.cpp's q4_1 x q8_1
 * arithmetic, beside the 16-bit kernel (qblock_vnni.c), for the projection kinds
 * CBSERVE_QBLOCK_ACT8 names (compute/qblock_vnni8.py; none by default). Why none: on
 * SmolLM2-135M, 8-bit inputs to any one of qkv, gate_up, down or the head already turn
 * the reply to "What is the capital of France?" from "The capital ..." to "L'Étoile, la
 * Marseillaise," (float32's first token leads by 0.08 logits; 8-bit blocks move it
 * 0.1-0.3), though perplexity stays within 0.3% (bench/micro/act8_accuracy.py). On the
 * real path (Zen 4, `CBSERVE_QBLOCK_ACT8=... cbserve bench accuracy --paths q4_1`) the
 * gate's replies were 11/16 for all four kinds, 10/16 for qkv + gate_up, 11/16 for
 * o + gate_up, 12/16 for gate_up alone and 13/16 for o alone (the gate asks 12; the
 * 16-bit path has 15/16, llama.cpp's own Q4_1 x Q8_1 8/16): no mix of half the step's
 * multiplies passes. The kernel itself ran 1.45-1.63x the 16-bit one at M = 64.
 *
 * x is quantized per row in blocks of 32: dx = max|x| / 127, qx = round(x / dx) in int8,
 * sx = dx * sum(qx), all kept in float32 (llama.cpp rounds dx and sx to float16). A
 * block's dot product:  sum_j (d q_j + m) x_j ~= d dx sum_j q_j qx_j + m sx, with q_j the
 * unsigned nibbles (vpdpbusd's unsigned operand) and qx_j the signed bytes.
 *
 * Layout: as the 16-bit kernel's, output rows in panels of 16, one per 32-bit lane, but 4
 * consecutive k of a row per lane: the nibbles are widened to bytes and transposed once
 * per call (the same 32-bit-word transpose, qblock_vnni_transpose.h, on rows of k / 2
 * int16), and each row of x broadcasts 4 of its bytes against a panel vector. Needs K a
 * multiple of 64 (the transpose's 16 words); qblock_vnni8_reads() says so.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_vnni.h"
#include "qblock_vnni8.h"
#include "qblock_vnni_transpose.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { QK = 32, Q4_1_BYTES = 20, LANES = 16, ROWS = 8 };

/* acc += wv (16 x 4 unsigned bytes) . (the 4 signed bytes at `quad`, broadcast to every
 * lane). In asm for the embedded broadcast, as qblock_vnni_dot.h's DPWSSD_BROADCAST. */
#define DPBUSD_BROADCAST(acc, wv, quad) \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wv), "m"(*(const int32_t *)(quad)))

int qblock_vnni8_reads(int64_t k)
{
    return k > 0 && k % 64 == 0;
}

VNNI_TARGET void qblock_vnni8_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *qx,
                                            float *dx, float *sx)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < k / QK; b++) {
            const float *v = x + i * k + b * QK;
            __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            float amax =
                _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(inv)));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(inv)));
            int8_t *out = qx + i * k + b * QK;
            _mm_storeu_si128((__m128i *)out, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(out + 16), _mm512_cvtsepi32_epi8(q1));
            dx[i * (k / QK) + b] = d;
            sx[i * (k / QK) + b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
}

/* Panel of `rows` <= 16 Q4_1 rows -> wq[K/4][16][4] nibbles as bytes, wd/wm[K/32][16]
 * (missing rows are zeros). tmp holds 16 rows of K bytes. */
VNNI_TARGET static void pack_panel(const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t k,
                                   uint8_t *tmp, uint8_t *wq, float *wd, float *wm)
{
    const __m128i low = _mm_set1_epi8(0x0f);
    for (int64_t r = 0; r < LANES; r++)
        for (int64_t b = 0; b < k / QK; b++) {
            uint8_t *dst = tmp + r * k + b * QK;
            if (r >= rows) {
                memset(dst, 0, QK);
                wd[b * LANES + r] = wm[b * LANES + r] = 0.0f;
                continue;
            }
            const uint8_t *blk = w + r * row_bytes + b * Q4_1_BYTES;
            uint16_t d, m;
            memcpy(&d, blk, 2);
            memcpy(&m, blk + 2, 2);
            wd[b * LANES + r] = _cvtsh_ss(d);
            wm[b * LANES + r] = _cvtsh_ss(m);
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 4));
            _mm_storeu_si128((__m128i *)dst, _mm_and_si128(q, low));
            _mm_storeu_si128((__m128i *)(dst + 16), _mm_and_si128(_mm_srli_epi16(q, 4), low));
        }
    /* A row of k bytes is k / 2 int16: the 32-bit words move as the 16-bit kernel's. */
    vnni_transpose_panel((const int16_t *)tmp, k / 2, (int16_t *)wq);
}

/* MM rows of x (a constant after inlining) against one packed panel. */
VNNI_TARGET INLINE void panel_rows(const uint8_t *wq, const float *wd, const float *wm,
                                   const int8_t *qx, const float *dx, const float *sx, int64_t k,
                                   float *y, int64_t ldy, int64_t rows, const int MM)
{
    const int64_t blocks = k / QK;
    __m512 acc[ROWS];
    for (int i = 0; i < MM; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        __m512i dot[ROWS];
        for (int i = 0; i < MM; i++)
            dot[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int s = 0; s < QK / 4; s++) {
            __m512i wv = _mm512_loadu_si512(wq + (b * (QK / 4) + s) * 64);
            for (int i = 0; i < MM; i++)
                DPBUSD_BROADCAST(dot[i], wv, qx + i * k + b * QK + 4 * s);
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

VNNI_TARGET void qblock_vnni8_panel(const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                                    const int8_t *qx, const float *dx, const float *sx, int64_t m,
                                    float *y, int64_t ldy, uint8_t *tmp, float *wd)
{
    const int64_t blocks = k / QK, row_bytes = blocks * Q4_1_BYTES;
    uint8_t *wq = tmp + LANES * k;
    float *wm = wd + LANES * blocks;
    pack_panel(w + first * row_bytes, row_bytes, rows, k, tmp, wq, wd, wm);
    int64_t i = 0;
    for (; i + ROWS <= m; i += ROWS)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * blocks, sx + i * blocks, k,
                   y + i * ldy + first, ldy, rows, ROWS);
    for (; i < m; i++)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * blocks, sx + i * blocks, k,
                   y + i * ldy + first, ldy, rows, 1);
}

/* Returns 0; -1 without VNNI, -2 for a K qblock_vnni8_reads() refuses, -3 out of memory. */
int qblock_vnni8_gemm(const uint8_t *w, const float *x, float *y, int64_t m_count, int64_t n,
                      int64_t k, int threads)
{
    if (!qblock_vnni_supported())
        return -1;
    if (!qblock_vnni8_reads(k))
        return -2;
    const int64_t blocks = k / QK;
    int8_t *qx = malloc((size_t)(m_count * k));
    float *dx = malloc(sizeof(float) * m_count * blocks), *sx = malloc(sizeof(float) * m_count * blocks);
    if (!qx || !dx || !sx) {
        free(qx), free(dx), free(sx);
        return -3;
    }
    qblock_vnni8_quantize_rows(x, m_count, k, qx, dx, sx);
    int failed = 0;
    const int64_t panels = (n + LANES - 1) / LANES;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        uint8_t *tmp = aligned_alloc(64, 2 * LANES * k);
        float *wd = aligned_alloc(64, sizeof(float) * LANES * blocks * 2);
        if (!tmp || !wd) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < panels; p++) {
            if (!tmp || !wd)
                continue;
            int64_t rows = n - p * LANES < LANES ? n - p * LANES : LANES;
            qblock_vnni8_panel(w, p * LANES, rows, k, qx, dx, sx, m_count, y, n, tmp, wd);
        }
        free(tmp);
        free(wd);
    }
    free(qx), free(dx), free(sx);
    return failed ? -3 : 0;
}
