/* Half-precision scales as the block kernels read them, shared by qblock_gemm.c and the
 * per-format files (qblock_q4q8.c, qblock_kquants*.c) linked with it. */
#ifndef CBSERVE_QBLOCK_HALF_H
#define CBSERVE_QBLOCK_HALF_H

#include <stdint.h>
#include <string.h>

/* IEEE half to float, exact for every input (subnormals included), without F16C: what
 * fills the table below, and the plain C variant's own conversion. */
static inline float qblock_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: normalise into a float */
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Every half's exact float value, filled by qblock_gemm.c when the library loads: a
 * broadcast from this table is a load, where F16C's conversion and broadcast would take
 * two shuffle-port uops that the unpacking of the weights already needs. */
extern float qblock_half_values[1 << 16];

static inline uint16_t qblock_load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float qblock_half(const uint8_t *p)
{
    return qblock_half_values[qblock_load_u16(p)];
}

#endif
