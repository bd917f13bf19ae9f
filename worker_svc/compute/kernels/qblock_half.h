/* Half-precision scales as the block kernels read them, shared by qblock_gemm.c and the
 * per-format files (qblock_kquants*.c) linked with it. */
#ifndef CBSERVE_QBLOCK_HALF_H
#define CBSERVE_QBLOCK_HALF_H

#include <stdint.h>
#include <string.h>

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
