/* The VNNI kernel's pieces shared with the native decode step
 * (worker_svc/models/qblock/kernels/decode_step.c), which links qblock_vnni.c's object. Run
 * them only where qblock_vnni_supported() says so. */
#ifndef CBSERVE_QBLOCK_VNNI_H
#define CBSERVE_QBLOCK_VNNI_H

#include <stdint.h>

enum { QBLOCK_VNNI_PANEL_ROWS = 16 };

int qblock_vnni_supported(void);

/* Rows x[m, k] -> qx[m, k] int16, dx and sx [m, k / 32]: the activations' blocks. */
void qblock_vnni_quantize_rows(const float *x, int64_t m, int64_t k, int16_t *qx, float *dx,
                               float *sx);

/* Output rows first .. first + rows - 1 (rows <= QBLOCK_VNNI_PANEL_ROWS) of y[m, ldy] for
 * the quantized rows of x. Scratch: tmp holds 2 * 16 * k int16, wd 2 * 16 * k / 32 floats,
 * both 64-byte aligned. */
void qblock_vnni_panel(int format, const uint8_t *w, int64_t first, int64_t rows, int64_t k,
                       const int16_t *qx, const float *dx, const float *sx, int64_t m, float *y,
                       int64_t ldy, int16_t *tmp, float *wd);

/* rows <= 16 rows of Q4_1, Q8_0 or MXFP4 blocks (row_bytes apart) packed as
 * qblock_vnni_panel packs them (qblock_vnni_pack.h): wq[k / 2][16][2] int16, wd and wm
 * [k / 32][16] floats, missing rows zeros. For tests. */
void qblock_vnni_pack_panel(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                            int64_t k, int16_t *wq, float *wd, float *wm);

/* A panel's transpose (qblock_vnni_transpose.h, which the packers inline), for tests. */
void qblock_vnni_transpose_panel(const int16_t *tmp, int64_t k, int16_t *wq);

#endif
