/* The bf16 panel kernel (qblock_bf16_panel.c): BF16 rows (QBLOCK_FORMAT_BF16) times
 * activations rounded to bfloat16, in vdpbf16ps (AVX-512 BF16) with float32 sums. Shared
 * with the native decode step (worker_svc/models/qblock/kernels/decode_panels.h), which
 * links its object. Run the others only where qblock_bf16_supported() says so. */
#ifndef CBSERVE_QBLOCK_BF16_PANEL_H
#define CBSERVE_QBLOCK_BF16_PANEL_H

#include <stdint.h>

enum { QBLOCK_BF16_PANEL_ROWS = 16 };

/* 1 where the CPU has AVX-512 F, BW and BF16. */
int qblock_bf16_supported(void);

/* Rows x[m, k] float32 -> xb bfloat16 (round to nearest even), k a multiple of 32, laid
 * out as xb[k / 32][m][32]: each block of 32 k of every row side by side. */
void qblock_bf16_convert_rows(const float *x, int64_t m, int64_t k, uint16_t *xb);

/* Output rows first .. first + rows - 1 (rows <= QBLOCK_BF16_PANEL_ROWS) of y[m, ldy] =
 * xb @ W^T for W's BF16 rows w[N, k] (2 k bytes a row), xb as convert_rows lays it out;
 * round: each output rounded to bfloat16 (as torch's bfloat16 GEMM writes it). tmp holds
 * 2 * 16 * k uint16, 64-byte aligned: the panel's rows, transposed into pairs of k. */
void qblock_bf16_panel(const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                       const uint16_t *xb, int64_t m, float *y, int64_t ldy, int round,
                       uint16_t *tmp);

/* y[m, n] = bf16(x[m, k]) @ W^T on `threads` threads (round: as qblock_bf16_panel's).
 * Returns 0; -1 without AVX-512 BF16, -2 for a k not a multiple of 32, -3 out of memory. */
int qblock_bf16_gemm(const uint8_t *w, const float *x, float *y, int64_t m, int64_t n, int64_t k,
                     int round, int threads);

#endif
