/* The VNNI kernel's panels packed once, when a weight is loaded (compute/qblock_prepacked.py),
 * instead of at every call: qblock_vnni.c's qblock_vnni_panel widens a panel's nibbles to
 * int16 and transposes them before its rows of x meet them, the same work at every call
 * whatever M. Measured on Zen 4 (1 thread, N=3072 K=576 Q4_1) that work is 7-10% of a call
 * at M = 64 and more below. Prepacked, a weight holds its int16 pairs (2 bytes a weight)
 * and its float scales (8 bytes a block of 32) beside its blocks, and the large-M calls
 * (QBlockLinear, the native step's panels) read them: the same panel_rows on the same
 * values, so the same result bit for bit. Q4_1, Q8_0 and MXFP4 only: the K-quants and
 * Q5_0 pack in qblock_kquants_vnni.c. */
#include <stdint.h>
#include <stdlib.h>

#include "qblock_gemm.h"
#include "qblock_vnni.h"

enum { LANES = QBLOCK_VNNI_PANEL_ROWS, QK = 32 };

int qblock_vnni_prepack(int format, const uint8_t *w, int64_t n, int64_t k, int16_t *panels,
                        float *scales, int threads)
{
    if (!qblock_vnni_supported())
        return -1;
    if (!qblock_vnni_prepacks(format) || k % QK != 0)
        return -2;
    const int64_t row_bytes = qblock_row_bytes(format, k);
    const int64_t count = (n + LANES - 1) / LANES;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        int16_t *tmp = aligned_alloc(64, sizeof(int16_t) * LANES * k);
        if (!tmp) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < count; p++) {
            if (!tmp)
                continue;
            const int64_t rows = n - p * LANES < LANES ? n - p * LANES : LANES;
            qblock_vnni_pack_panel(format, w + p * LANES * row_bytes, rows, k, tmp,
                                   panels + p * LANES * k, scales + p * k);
        }
        free(tmp);
    }
    return failed ? -3 : 0;
}
