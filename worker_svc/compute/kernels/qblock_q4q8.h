/* The unpacking of Q4_1 and Q8_0 blocks (qblock_q4q8.c), called by the dispatch in
 * qblock_gemm.c beside the K-quant formats' (qblock_kquants.h). */
#ifndef CBSERVE_QBLOCK_Q4Q8_H
#define CBSERVE_QBLOCK_Q4Q8_H

#include <stdint.h>

#include "qblock_gemm.h"

/* Bytes of one block of 32 weights. */
enum { QBLOCK_Q4_1_BYTES = 20, QBLOCK_Q8_0_BYTES = 34 };

/* A row of K weights (format Q4_1 or Q8_0) into out[K] float32, per variant. */
void q4q8_dequant_plain(int format, const uint8_t *row, int64_t k, float *out);
void q4q8_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out);
void q4q8_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out);
/* The rows of x a small tile takes (AVX-512); more go through the panel's buffer. */
enum { Q4Q8_SMALL_M = 8 };

/* rows <= 4 weight rows times m_count <= Q4Q8_SMALL_M rows of x, weights dequantized in
 * registers and used at once (no panel buffer). */
void q4q8_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                            const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);

#endif
