/* The gated MLP's elementwise half for the native decode step (decode_step.c):
 * out = act(gate) * up, with SiLU (Llama, Qwen, Mistral) or GELU's tanh approximation
 * (Gemma, transformers' gelu_pytorch_tanh). Its own file because it is the one part built
 * with -ffast-math, which lets gcc vectorise expf and tanhf through glibc's vector math
 * library; the rest of the step is built without it, so that its rotary and norms round
 * as torch's do. */
#include <math.h>
#include <stdint.h>

void llama_silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void gelu_tanh_mul(const float *gate, const float *up, float *out, int64_t n)
{
    /* sqrt(2 / pi) and the cubic's coefficient, as torch's tanh approximation has them. */
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        out[i] = 0.5f * x * (1.0f + tanhf(beta * (x + kappa * x * x * x))) * up[i];
    }
}
