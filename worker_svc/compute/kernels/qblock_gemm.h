/* The block kernel's entry points shared with other native code (the decode step,
 * worker_svc/models/qblock/kernels/decode_step.c), which links the kernel's objects
 * (compute/qblock.py PARTS). */
#ifndef CBSERVE_QBLOCK_GEMM_H
#define CBSERVE_QBLOCK_GEMM_H

#include <stdint.h>

/* Format codes (compute/qblock.py's BlockFormat.code). Q4_1 and Q8_0 are blocks of 32
 * weights (this file); the K-quants are read by qblock_kquants*.c, Q4_K, Q5_K and Q6_K in
 * super-blocks of 256 (K a multiple of 256), Q5_0 in blocks of 32; F16 and BF16 by
 * qblock_float16.c, K a multiple of 32; MXFP4 by qblock_mxfp4.c, in blocks of 32. */
enum {
    QBLOCK_FORMAT_Q4_1 = 0,
    QBLOCK_FORMAT_Q8_0 = 1,
    QBLOCK_FORMAT_Q4_K = 2,
    QBLOCK_FORMAT_Q5_K = 3,
    QBLOCK_FORMAT_Q6_K = 4,
    QBLOCK_FORMAT_Q5_0 = 5,
    QBLOCK_FORMAT_F16 = 6,  /* 16-bit floats (qblock_float16.h), 32 a "block" */
    QBLOCK_FORMAT_BF16 = 7,
    QBLOCK_FORMAT_MXFP4 = 8, /* gpt-oss's experts, 17 bytes per 32 (qblock_mxfp4.h) */
    QBLOCK_FORMATS = 9
};
/* Variant codes (compute/qblock.py's VARIANTS): AUTO asks for the best this CPU runs;
 * the kernel's parts take only a resolved one. */
enum {
    QBLOCK_VARIANT_AUTO = 0,
    QBLOCK_VARIANT_PLAIN = 1,
    QBLOCK_VARIANT_AVX2 = 2,
    QBLOCK_VARIANT_AVX512 = 3
};
/* Output rows a thread takes at a time, and the floats its panel buffer must hold per
 * unit of K (PANEL_ROWS rows of K float32 weights). */
enum { QBLOCK_PANEL_ROWS = 32 };

/* The variant to run for a requested one (0 = the best this CPU runs), or -1 when this
 * CPU cannot run it. */
int qblock_resolve_variant(int variant);

/* Bytes of one row of K weights in `format`. */
int64_t qblock_row_bytes(int format, int64_t k);

/* 1 when `format` is a known code and K a whole number of its blocks. */
int qblock_format_fits(int format, int64_t k);

/* Output rows first .. first + rows - 1 (rows <= QBLOCK_PANEL_ROWS) of y[M, ldy] =
 * x[M, K] @ W^T: one thread's unit of work, run inside the caller's parallel region.
 * `buf` holds QBLOCK_PANEL_ROWS * K floats, 64-byte aligned (unused at small M on
 * AVX-512). `variant` must be resolved. */
void qblock_panel(int variant, int format, const uint8_t *w, int64_t first, int64_t rows,
                  const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy, float *buf);

#endif
