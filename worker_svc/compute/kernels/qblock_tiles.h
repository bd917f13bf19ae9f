/* The float tiles (qblock_tiles.c): a panel's weight rows, already unpacked into
 * float32, times rows of x; the same for every block format. */
#ifndef CBSERVE_QBLOCK_TILES_H
#define CBSERVE_QBLOCK_TILES_H

#include <stdint.h>

/* y[i * ldy + r] = w[r, :] . x[i, :] for r < rows (at most 4) and i < m_count; w and x
 * are rows of k floats. `variant` must be resolved (QBLOCK_VARIANT_PLAIN and up). */
void qblock_tile(int variant, const float *w, int64_t rows, const float *x, int64_t m_count,
                 int64_t k, float *y, int64_t ldy);

#endif
