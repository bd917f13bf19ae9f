/* The block kernel's entry points shared with other native code (the decode step,
 * worker_svc/models/kernels/llama_decode.c), which links qblock_gemm.c's object. */
#ifndef CBSERVE_QBLOCK_GEMM_H
#define CBSERVE_QBLOCK_GEMM_H

#include <stdint.h>

enum { QBLOCK_FORMAT_Q4_1 = 0, QBLOCK_FORMAT_Q8_0 = 1 };
/* Output rows a thread takes at a time, and the floats its panel buffer must hold per
 * unit of K (PANEL_ROWS rows of K float32 weights). */
enum { QBLOCK_PANEL_ROWS = 32 };

/* The variant to run for a requested one (0 = the best this CPU runs), or -1 when this
 * CPU cannot run it. */
int qblock_resolve_variant(int variant);

/* Bytes of one row of K weights in `format`. */
int64_t qblock_row_bytes(int format, int64_t k);

/* Output rows first .. first + rows - 1 (rows <= QBLOCK_PANEL_ROWS) of y[M, ldy] =
 * x[M, K] @ W^T: one thread's unit of work, run inside the caller's parallel region.
 * `buf` holds QBLOCK_PANEL_ROWS * K floats, 64-byte aligned (unused at small M on
 * AVX-512). `variant` must be resolved. */
void qblock_panel(int variant, int format, const uint8_t *w, int64_t first, int64_t rows,
                  const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy, float *buf);

#endif
