/* Row operations of the native decode step (decode_step.c): RMSNorm, a residual add and
 * rotary, in the Python forward's order of operations (built with -ffp-contract=off, so
 * that x1 * cos - x2 * sin rounds twice, as in torch). */
#ifndef CBSERVE_DECODE_ROWS_H
#define CBSERVE_DECODE_ROWS_H

#include <math.h>
#include <stdint.h>

static void rms_norm(const float *x, const float *weight, int64_t n, float eps, float *out)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++)
        sum += x[i] * x[i];
    float inv = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = weight[i] * (x[i] * inv);
}

static void rms_norm_rows(const float *x, const int64_t *rows, int64_t count, const float *weight,
                          int64_t n, float eps, float *out)
{
    for (int64_t i = 0; i < count; i++)
        rms_norm(x + (rows ? rows[i] : i) * n, weight, n, eps, out + i * n);
}

static void add_row(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* x[heads][d] in place: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), torch's order. */
static void rotate(float *x, int64_t heads, int64_t d, const float *cos, const float *sin)
{
    const int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++, x += d)
        for (int64_t i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cos[i] - x2 * sin[i];
            x[i + half] = x2 * cos[i] + x1 * sin[i];
        }
}

#endif
