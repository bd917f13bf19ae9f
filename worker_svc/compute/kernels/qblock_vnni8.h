/* The 8-bit-activation VNNI kernel (qblock_vnni8.c: Q4_1 weights, vpdpbusd), shared with
 * the native decode step. Run it only where qblock_vnni_supported() says so. */
#ifndef CBSERVE_QBLOCK_VNNI8_H
#define CBSERVE_QBLOCK_VNNI8_H

#include <stdint.h>

/* Whether the kernel reads a K (a multiple of 64). */
int qblock_vnni8_reads(int64_t k);

/* Rows x[m, k] -> qx[m, k] int8, dx and sx [m, k / 32]: the activations' 8-bit blocks. */
void qblock_vnni8_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *qx, float *dx,
                                float *sx);

/* Output rows first .. first + rows - 1 (rows <= 16) of y[m, ldy] = x @ W^T for Q4_1 rows
 * W and the quantized rows of x. Scratch (64-byte aligned): tmp 2 * 16 * k bytes, wd
 * 2 * 16 * k / 32 floats (the 16-bit kernel's scratch is large enough). */
void qblock_vnni8_panel(const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                        const int8_t *qx, const float *dx, const float *sx, int64_t m, float *y,
                        int64_t ldy, uint8_t *tmp, float *wd);

/* The whole product, threaded over panels: 0, or -1 (no VNNI), -2 (K), -3 (memory). */
int qblock_vnni8_gemm(const uint8_t *w, const float *x, float *y, int64_t m_count, int64_t n,
                      int64_t k, int threads);

#endif
