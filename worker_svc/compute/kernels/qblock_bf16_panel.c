/* y[M, N] = bf16(x[M, K]) @ W[N, K]^T for W's BF16 rows (a bfloat16 checkpoint served as
 * bfloat16-weights, a bf16 GGUF), in AVX-512 BF16's vdpbf16ps: two bf16 products a
 * float32 lane, summed in float32, no scaling (the rows are their own values).
 *
 * The activations are rounded to bfloat16 (nearest even, vcvtne2ps2bf16) once per
 * projection, as torch's bfloat16 GEMM takes them (compute/qblock_linear.py bf16_matmul,
 * the Python forward's path for such rows) and as llama.cpp rounds them for BF16
 * weights. The sums are float32; `round` rounds each output to bfloat16 (nearest even)
 * as torch's bfloat16 GEMM writes it, so that the native step's greedy tokens are the
 * Python forward's: a random checkpoint's bfloat16 logits tie often, and argmax breaks
 * a tie by the lowest index, which float32 logits do not reproduce.
 *
 * Layout, as the VNNI kernel's (qblock_vnni.c): output rows in panels of 16, one per
 * float32 lane. A panel's rows are transposed once per call into pairs of k
 * (wq[K / 2][16][2] bf16, qblock_vnni_transpose.h: the transpose moves 32-bit words, so
 * it serves bf16 pairs as it serves int16 ones); each row of x then broadcasts one pair
 * against the panel's vector. Rows of x go 8 at a time, so each weight vector is loaded
 * once for 8 rows; the last M % 8 rows in one pass of that many.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_bf16_panel.h"
#include "qblock_vnni_transpose.h"

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE static inline __attribute__((always_inline))

enum { LANES = QBLOCK_BF16_PANEL_ROWS, ROWS = 8, QK = 32 };

int qblock_bf16_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

/* Rows `from` .. `to` - 1 of x[m, k] into xb[k / 32][m][32]: a block of 32 k of every row
 * side by side, so that the panel's 8 rows of a block lie at constant offsets from one
 * address (GCC 12 kept a register or a stack slot for each row's address otherwise). */
BF16_TARGET static void convert_rows(const float *x, int64_t from, int64_t to, int64_t m,
                                     int64_t k, uint16_t *xb)
{
    for (int64_t i = from; i < to; i++)
        for (int64_t b = 0; b < k; b += QK) {
            const float *src = x + i * k + b;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
            _mm512_storeu_si512(xb + (b * m + i * QK), (__m512i)v);
        }
}

BF16_TARGET void qblock_bf16_convert_rows(const float *x, int64_t m, int64_t k, uint16_t *xb)
{
    convert_rows(x, 0, m, m, k, xb);
}

/* acc += wv . (the bf16 pair at `pair`, broadcast to every lane): vdpbf16ps with the pair
 * as an embedded broadcast, in asm for the reason qblock_vnni_dot.h gives (GCC 12 puts a
 * separate broadcast and register copies beside the intrinsic's every product). */
#define DPBF16_BROADCAST(acc, wv, pair) \
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wv), "m"(*(const int32_t *)(pair)))

/* MM rows of xb (a constant after inlining; xb at the first's block 0, m rows in all)
 * against one transposed panel. */
BF16_TARGET INLINE void panel_rows(const uint16_t *wq, const uint16_t *xb, int64_t m, int64_t k,
                                   float *y, int64_t ldy, int64_t rows, int round, const int MM)
{
    __m512 acc[ROWS];
    for (int i = 0; i < MM; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k; b += QK) { /* 16 pairs of k a pass: no remainder loop */
        const uint16_t *wb = wq + b * LANES, *xr = xb + b * m;
#pragma GCC unroll 16
        for (int s = 0; s < QK / 2; s++) {
            const __m512i wv = _mm512_load_si512(wb + s * 2 * LANES);
            for (int i = 0; i < MM; i++)
                DPBF16_BROADCAST(acc[i], wv, xr + i * QK + 2 * s);
        }
    }
    const __mmask16 keep = (__mmask16)((1u << rows) - 1u);
    for (int i = 0; i < MM; i++) {
        if (round) { /* to bfloat16 (nearest even) and back: bits 16 .. 31 of the float */
            const __m256i half = (__m256i)_mm512_cvtneps_pbh(acc[i]);
            acc[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
        }
        _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
    }
}

BF16_TARGET void qblock_bf16_panel(const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                                   const uint16_t *xb, int64_t m, float *y, int64_t ldy,
                                   int round, uint16_t *tmp)
{
    const uint16_t *panel = (const uint16_t *)w + first * k;
    uint16_t *wq = tmp + LANES * k;
    if (rows < LANES) { /* the last panel: its rows, then zeros, in tmp */
        memcpy(tmp, panel, sizeof(uint16_t) * rows * k);
        memset(tmp + rows * k, 0, sizeof(uint16_t) * (LANES - rows) * k);
        panel = tmp;
    }
    vnni_transpose_panel((const int16_t *)panel, k, (int16_t *)wq);
    y += first;
    int64_t i = 0;
    for (; i + ROWS <= m; i += ROWS)
        panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, ROWS);
    switch (m - i) { /* the rest in one pass, each row count its own unrolled loop */
    case 7: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 7); break;
    case 6: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 6); break;
    case 5: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 5); break;
    case 4: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 4); break;
    case 3: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 3); break;
    case 2: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 2); break;
    case 1: panel_rows(wq, xb + i * QK, m, k, y + i * ldy, ldy, rows, round, 1); break;
    default: break;
    }
}

BF16_TARGET static int gemm(const uint8_t *w, const float *x, float *y, int64_t m, int64_t n,
                            int64_t k, int round, int threads)
{
    uint16_t *xb = malloc(sizeof(uint16_t) * m * k);
    if (!xb)
        return -3;
    int failed = 0;
    const int64_t panels = (n + LANES - 1) / LANES;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++)
            convert_rows(x, i, i + 1, m, k, xb);
        uint16_t *tmp = aligned_alloc(64, sizeof(uint16_t) * 2 * LANES * k);
        if (!tmp) {
#pragma omp atomic write
            failed = 1;
        }
        /* Dynamic: a thread that loses its core on a shared machine hands on its panels. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < panels; p++) {
            if (!tmp)
                continue;
            const int64_t rows = n - p * LANES < LANES ? n - p * LANES : LANES;
            qblock_bf16_panel(w, p * LANES, rows, k, xb, m, y, n, round, tmp);
        }
        free(tmp);
    }
    free(xb);
    return failed ? -3 : 0;
}

/* No AVX-512 instruction runs before the CPU is checked. */
int qblock_bf16_gemm(const uint8_t *w, const float *x, float *y, int64_t m, int64_t n, int64_t k,
                     int round, int threads)
{
    if (!qblock_bf16_supported())
        return -1;
    if (k % QK != 0)
        return -2;
    return gemm(w, x, y, m, n, k, round, threads);
}
