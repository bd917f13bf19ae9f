/* MXFP4 blocks (GGUF type 39: gpt-oss's experts) read as the file stores them
 * (qblock_mxfp4.c), beside Q4_1 / Q8_0 (qblock_q4q8.h) and the K-quants (qblock_kquants.h).
 *
 * A block is 17 bytes for 32 weights: one E8M0 byte e, then 16 bytes of 4-bit E2M1 codes,
 * byte j holding weight j in its low nibble and weight j + 16 in its high one. As
 * llama.cpp reads it (kvalues_mxfp4, ggml_e8m0_to_fp32_half), a code is one of the 16
 * integers QBLOCK_MXFP4_CODES (E2M1's values doubled) and the scale is 2^(e - 128) (the
 * power of two halved to match): w = code * 2^(e - 128). Every such product is exact in
 * float32 (a power of two times an integer of at most 4 bits; e = 0 and 1 give subnormal
 * scales, still exact), so each weight is what gguf-py's dequantizer computes, and the
 * VNNI kernel takes the codes as exact int16 with the power of two as the block's scale
 * (no minimum, as Q8_0). */
#ifndef CBSERVE_QBLOCK_MXFP4_H
#define CBSERVE_QBLOCK_MXFP4_H

#include <stdint.h>

#include "qblock_gemm.h"

enum { QBLOCK_MXFP4_BYTES = 17 };
/* The rows of x a small tile takes (AVX-512); more go through the panel's buffer. */
enum { MXFP4_SMALL_M = 8 };

/* A code's value (E2M1 doubled): 0, 1, 2, 3, 4, 6, 8, 12, then the same negated. */
#define QBLOCK_MXFP4_CODES {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

/* 2^(e - 128) for every E8M0 byte e, filled when the library loads: a block's scale is a
 * load from here (as qblock_half_values for the f16 scales of the other formats). */
extern float qblock_e8m0_values[256];

/* A row of K weights into out[K] float32, per variant. */
void mxfp4_dequant_plain(const uint8_t *row, int64_t k, float *out);
void mxfp4_dequant_avx2(const uint8_t *row, int64_t k, float *out);
void mxfp4_dequant_avx512(const uint8_t *row, int64_t k, float *out);

/* rows <= 4 weight rows times m_count <= MXFP4_SMALL_M rows of x, weights dequantized in
 * registers and used at once (no panel buffer); `format` is MXFP4's (the small tiles'
 * common signature, qblock_gemm.c). */
void mxfp4_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                             const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);

#endif
