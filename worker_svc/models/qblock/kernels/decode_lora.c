/* The native decode step's LoRA arithmetic (decode_lora.h says where the step applies
 * it): the shrink `t = a @ x` of a chunk of an adapter's A rows for the rows of one
 * group, and the expand `y += b @ t` of a range of output rows.
 *
 * Built apart from decode_step.c (-ffp-contract=off there), with fused multiply-adds:
 * the Python path's delta is torch's float32 matmul, which fuses too; the two differ in
 * the order of their sums only. Each A row is read once for every row of its group, and
 * four A rows go together against one input row, so that four sums are in flight (a
 * single running sum would wait on each add at one row, where the A rows are the step's
 * whole cost). */
#include <stdint.h>

void lora_shrink(const float *a, int64_t count, int64_t in, const float *x, int64_t ldx,
                 const int64_t *rows, int64_t n_rows, float *shrunk, int64_t width)
{
    int64_t r = 0;
    for (; r + 4 <= count; r += 4) {
        const float *a0 = a + r * in, *a1 = a0 + in, *a2 = a1 + in, *a3 = a2 + in;
        for (int64_t i = 0; i < n_rows; i++) {
            const float *xr = x + rows[i] * ldx;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t k = 0; k < in; k++) {
                s0 += a0[k] * xr[k];
                s1 += a1[k] * xr[k];
                s2 += a2[k] * xr[k];
                s3 += a3[k] * xr[k];
            }
            float *out = shrunk + rows[i] * width + r;
            out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
        }
    }
    for (; r < count; r++) {
        const float *ar = a + r * in;
        for (int64_t i = 0; i < n_rows; i++) {
            const float *xr = x + rows[i] * ldx;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t k = 0; k < in; k++)
                sum += ar[k] * xr[k];
            shrunk[rows[i] * width + r] = sum;
        }
    }
}

void lora_expand(const float *b, int64_t ldb, int64_t n, int64_t rank, const float *shrunk,
                 int64_t width, const int64_t *rows, int64_t n_rows, float *y, int64_t ldy)
{
    for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * ldb;
        for (int64_t i = 0; i < n_rows; i++) {
            const float *t = shrunk + rows[i] * width;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t r = 0; r < rank; r++)
                sum += bj[r] * t[r];
            y[rows[i] * ldy + j] += sum;
        }
    }
}
