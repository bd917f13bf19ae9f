/* IEEE binary16 <-> float32 rows, for a float16 KV pool read and written by float32
 * arithmetic. Shared by the paged-decode kernel (reads) and the native decode step
 * (writes the new token's K/V).
 *
 * With F16C (every x86-64 CPU with AVX2, enabled by -march=native) eight values go per
 * instruction. Without it, a portable bit-level conversion: gcc's _Float16 would
 * compile, but on CPUs without AVX512-FP16 it converts one value per library call,
 * which measured 5x slower than the float32 pool it was meant to beat. Both round to
 * nearest even, as torch's .half() does, so a pool written here holds what torch would
 * have written.
 */
#ifndef CBSERVE_HALF_CONVERT_H
#define CBSERVE_HALF_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        /* Zero or subnormal: mantissa * 2^-24, exact in float32. */
        float magnitude = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13); /* inf, nan */
    } else {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t float_to_half(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)
        return sign | 0x7e00u; /* nan stays nan */
    if (magnitude >= 0x477ff000u)
        return sign | 0x7c00u; /* 65520 and above round to inf */
    if (magnitude < 0x38800000u) {
        /* Below 2^-14, the smallest normal half: a multiple of 2^-24, rounded to even
         * (the default rounding mode), which may carry into the smallest normal. */
        float scaled;
        memcpy(&scaled, &magnitude, sizeof scaled);
        return sign | (uint16_t)nearbyintf(scaled * 0x1p24f);
    }
    uint32_t half = (((magnitude >> 23) - 112u) << 10) | ((magnitude >> 13) & 0x3ffu);
    const uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++; /* a carry into the exponent is the right result */
    return sign | (uint16_t)half;
}

static inline void half_row_to_float(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = half_to_float(src[i]);
}

static inline void float_row_to_half(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        dst[i] = float_to_half(src[i]);
}

#endif
