/* The large-M VNNI kernel (qblock_vnni.c: 16-bit activation blocks, integer dot products
 * by vpdpwssd) for the K-quant formats and Q5_0 (layouts: qblock_kquants.h).
 *
 * The activations are qblock_vnni.c's: per row, blocks of 32 int16 qx with a scale dx
 * and sx = dx * sum(qx). A weight block is a run of integers q sharing one scale and,
 * for Q4_K / Q5_K, one minimum, so that a block's dot product is
 *     sum_j (ds q_j + neg_dm) x_j ~= ds dx sum_j q_j qx_j + neg_dm sx,
 * as for Q4_1: Q4_K / Q5_K blocks of 32 (a sub-block: ds = d * sc, neg_dm = -dmin * mn,
 * q 0..15 or 0..31), Q5_0 blocks of 32 (q - 16, no minimum), Q6_K blocks of 16 (its
 * scales' size: q - 32 times d * scale, no minimum; both halves of an activation block
 * share its dx). 16-bit activations, not llama.cpp's 8-bit Q8_K, for qblock_vnni.c's
 * reason: 8-bit blocks failed the greedy-reply gate on the default 135M model.
 *
 * A panel of 16 output rows is staged (qblock_kquants_stage.h: a group's integers as
 * bytes, its scales as floats), widened to int16 and transposed so that 2 consecutive k
 * of the 16 rows form one 64-byte vector, as qblock_vnni.c packs Q4_1. */
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_kquants.h"
#include "qblock_kquants_stage.h"
#include "qblock_vnni.h"
#include "qblock_vnni_dot.h"
#include "qblock_vnni_transpose.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

enum { QK = 32, LANES = 16, ROWS = 8 };

static int group_weights(int format)
{
    return format == QBLOCK_FORMAT_Q5_0 ? 32 : 256;
}

static int group_bytes(int format)
{
    return format == QBLOCK_FORMAT_Q4_K ? 144
           : format == QBLOCK_FORMAT_Q5_K ? 176
           : format == QBLOCK_FORMAT_Q6_K ? 210
                                          : 22;
}

/* Weights sharing one scale: Q6_K's 16, the others' 32. */
static int scale_block(int format)
{
    return format == QBLOCK_FORMAT_Q6_K ? 16 : QK;
}

/* Rows `rows` <= 16 of the panel at w -> wq[K/2][16][2] int16, wd (and wm, Q4_K / Q5_K)
 * [K / scale_block][16] floats; missing rows are zeros. tmp holds 16 rows of K int16. */
VNNI_TARGET static void pack_panel(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                                   int64_t k, int16_t *tmp, int16_t *wq, float *wd, float *wm)
{
    const int G = group_weights(format), QB = scale_block(format);
    const int has_min = format == QBLOCK_FORMAT_Q4_K || format == QBLOCK_FORMAT_Q5_K;
    const int64_t scale_blocks = k / QB, per_group = G / QB;
    for (int64_t r = 0; r < LANES; r++) {
        if (r >= rows) {
            memset(tmp + r * k, 0, sizeof(int16_t) * k);
            for (int64_t s = 0; s < scale_blocks; s++) {
                wd[s * LANES + r] = 0.0f;
                if (has_min)
                    wm[s * LANES + r] = 0.0f;
            }
            continue;
        }
        for (int64_t b = 0; b < k / G; b++) {
            struct kq_staged st;
            switch (format) { /* constant formats: the staging inlines per format */
            case QBLOCK_FORMAT_Q4_K: kq_stage(w + r * row_bytes + b * 144, QBLOCK_FORMAT_Q4_K, &st); break;
            case QBLOCK_FORMAT_Q5_K: kq_stage(w + r * row_bytes + b * 176, QBLOCK_FORMAT_Q5_K, &st); break;
            case QBLOCK_FORMAT_Q6_K: kq_stage(w + r * row_bytes + b * 210, QBLOCK_FORMAT_Q6_K, &st); break;
            default: kq_stage(w + r * row_bytes + b * 22, QBLOCK_FORMAT_Q5_0, &st); break;
            }
            int16_t *dst = tmp + r * k + b * G;
            for (int j = 0; j < G; j += 16) {
                const __m128i bytes = _mm_load_si128((const __m128i *)(st.q + j));
                _mm256_storeu_si256((__m256i *)(dst + j), kq_is_signed(format)
                                                              ? _mm256_cvtepi8_epi16(bytes)
                                                              : _mm256_cvtepu8_epi16(bytes));
            }
            for (int s = 0; s < per_group; s++) {
                const int64_t at = (b * per_group + s) * LANES + r;
                wd[at] = format == QBLOCK_FORMAT_Q5_0 ? st.sc[0] : st.sc[s];
                if (has_min)
                    wm[at] = st.sc[8 + s];
            }
        }
    }
    vnni_transpose_panel(tmp, k, wq); /* as qblock_vnni.c's panels */
}

/* MM rows of x (a constant after inlining) against one packed panel, QB weights a scale. */
VNNI_TARGET INLINE void panel_rows(const int16_t *wq, const float *wd, const float *wm,
                                   const int16_t *qx, const float *dx, const float *sx,
                                   int64_t k, float *y, int64_t ldy, int64_t rows, const int MM,
                                   const int QB, const int HAS_MIN)
{
    const int64_t blocks = k / QB, x_blocks = k / QK;
    __m512 acc[ROWS];
    for (int i = 0; i < MM; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        __m512i dot[ROWS];
        for (int i = 0; i < MM; i++)
            dot[i] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int s = 0; s < QB / 2; s++) {
            __m512i wv = _mm512_loadu_si512(wq + (b * (QB / 2) + s) * 32);
            for (int i = 0; i < MM; i++)
                DPWSSD_BROADCAST(dot[i], wv, qx + i * k + b * QB + 2 * s);
        }
        const int64_t xb = b * QB / QK;
        __m512 d = _mm512_loadu_ps(wd + b * LANES);
        for (int i = 0; i < MM; i++) {
            __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(dx[i * x_blocks + xb]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), scale, acc[i]);
            if (HAS_MIN)
                acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(wm + b * LANES),
                                         _mm512_set1_ps(sx[i * x_blocks + xb]), acc[i]);
        }
    }
    __mmask16 keep = (__mmask16)((1u << rows) - 1u);
    for (int i = 0; i < MM; i++)
        _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

/* All rows of x, 8 at a time, for one packed panel. */
VNNI_TARGET INLINE void panel_all(const int16_t *wq, const float *wd, const float *wm,
                                  const int16_t *qx, const float *dx, const float *sx, int64_t m,
                                  int64_t k, float *y, int64_t ldy, int64_t rows, const int QB,
                                  const int HAS_MIN)
{
    const int64_t x_blocks = k / QK;
    int64_t i = 0;
    for (; i + ROWS <= m; i += ROWS)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * x_blocks, sx + i * x_blocks, k, y + i * ldy,
                   ldy, rows, ROWS, QB, HAS_MIN);
    for (; i < m; i++)
        panel_rows(wq, wd, wm, qx + i * k, dx + i * x_blocks, sx + i * x_blocks, k, y + i * ldy,
                   ldy, rows, 1, QB, HAS_MIN);
}

VNNI_TARGET void kq_vnni_panel(int format, const uint8_t *w, int64_t first, int64_t rows,
                               int64_t k, const int16_t *qx, const float *dx, const float *sx,
                               int64_t m, float *y, int64_t ldy, int16_t *tmp, float *wd)
{
    const int64_t row_bytes = k / group_weights(format) * group_bytes(format);
    if (kq_small_vnni_reads(format) && m <= KQ_SMALL_VNNI_M) {
        kq_small_vnni(format, w + first * row_bytes, row_bytes, rows, k, qx, dx, sx, m, y + first,
                      ldy);
        return;
    }
    int16_t *wq = tmp + LANES * k;
    float *wm = wd + LANES * (k / QK); /* Q6_K's wd takes all 2 * LANES * K / 32 floats */
    pack_panel(format, w + first * row_bytes, row_bytes, rows, k, tmp, wq, wd, wm);
    y += first;
    switch (format) {
    case QBLOCK_FORMAT_Q4_K:
    case QBLOCK_FORMAT_Q5_K: panel_all(wq, wd, wm, qx, dx, sx, m, k, y, ldy, rows, 32, 1); break;
    case QBLOCK_FORMAT_Q6_K: panel_all(wq, wd, wm, qx, dx, sx, m, k, y, ldy, rows, 16, 0); break;
    default: panel_all(wq, wd, wm, qx, dx, sx, m, k, y, ldy, rows, 32, 0); break;
    }
}
