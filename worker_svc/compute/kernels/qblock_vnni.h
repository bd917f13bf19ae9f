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

/* Prepacked panels, for Q4_1, Q8_0 and MXFP4 (qblock_vnni_prepacks): every panel of 16 rows
 * of W[n, k] packed once, as qblock_vnni_panel packs it at every call: panel p's int16
 * pairs at panels + p * 16 * k ([k / 2][16][2]), its scales at scales + p * k ([2][k / 32][16]:
 * d, then m), a last panel's missing rows zero. qblock_vnni_prepacked.c. */
int qblock_vnni_prepacks(int format);
/* Returns 0; -1 without VNNI, -2 for a format not packed so or k not a multiple of 32,
 * -3 out of memory. */
int qblock_vnni_prepack(int format, const uint8_t *w, int64_t n, int64_t k, int16_t *panels,
                        float *scales, int threads);
void qblock_vnni_pack_panel(int format, const uint8_t *w, int64_t rows, int64_t k, int16_t *tmp,
                            int16_t *wq, float *wd);
/* qblock_vnni_panel's rows for one packed panel: wq [k / 2][16][2], wd [2][k / 32][16]. */
void qblock_vnni_packed_panel(const int16_t *wq, const float *wd, int64_t first, int64_t rows,
                              int64_t k, const int16_t *qx, const float *dx, const float *sx,
                              int64_t m, float *y, int64_t ldy);
/* qblock_vnni_gemm on prepacked panels (bit for bit its result). */
int qblock_vnni_prepacked_gemm(const int16_t *panels, const float *scales, const float *x,
                               float *y, int64_t m_count, int64_t n, int64_t k, int threads);

/* A panel's transpose (qblock_vnni_transpose.h, which the packers inline), for tests. */
void qblock_vnni_transpose_panel(const int16_t *tmp, int64_t k, int16_t *wq);

#endif
