/* SwiGLU's elementwise half for the native decode step (llama_decode.c): out = silu(gate)
 * * up. Its own file because it is the one part built with -ffast-math, which lets gcc
 * vectorise expf through glibc's vector math library; the rest of the step is built
 * without it, so that its rotary and norms round as torch's do. */
#include <math.h>
#include <stdint.h>

void llama_silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
