/* Exposes worker_svc/attention/kernels/half_convert.h's row conversions to the tests,
 * which build this file with and without F16C so both of its paths are checked. */
#include <stdint.h>

#include "half_convert.h"

void probe_float_to_half(const float *src, uint16_t *dst, int64_t n)
{
    float_row_to_half(src, dst, n);
}

void probe_half_to_float(const uint16_t *src, float *dst, int64_t n)
{
    half_row_to_float(src, dst, n);
}
