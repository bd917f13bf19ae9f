/* F16 and BF16 weights (GGUF ggml types 1 and 30: what llama.cpp's converter writes
 * with --outtype f16 / bf16, and a bfloat16 checkpoint's own values) as block formats
 * beside the quantized ones (qblock_float16.c). A "block" is 32 weights of 2 bytes, so
 * that a row is K * 2 bytes, exactly as the file stores it; each weight widens to
 * float32 exactly (an F16 by IEEE conversion, a BF16 by a 16-bit shift), which is what
 * gguf-py's dequantizer computes. */
#ifndef CBSERVE_QBLOCK_FLOAT16_H
#define CBSERVE_QBLOCK_FLOAT16_H

#include <stdint.h>

#include "qblock_gemm.h"

enum { QBLOCK_FLOAT16_BYTES = 64 }; /* 32 weights of 2 bytes */

static inline int f16_is_float16_format(int format)
{
    return format == QBLOCK_FORMAT_F16 || format == QBLOCK_FORMAT_BF16;
}

/* A row of K weights into out[K] float32, per variant. */
void f16_dequant_plain(int format, const uint8_t *row, int64_t k, float *out);
void f16_dequant_avx2(int format, const uint8_t *row, int64_t k, float *out);
void f16_dequant_avx512(int format, const uint8_t *row, int64_t k, float *out);
/* rows <= 4 weight rows times m_count <= 4 rows of x, weights widened in registers and
 * used at once (no panel buffer), for AVX-512 and for AVX2. */
void f16_small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                           const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);
void f16_small_tile_avx2(int format, const uint8_t *w, int64_t row_bytes, int64_t rows,
                         const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy);

#endif
