/* Paged attention for decode tokens on the CPU, float32, straight from the KV pool.
 *
 * The torch backend gathers every decode's blocks into one padded tensor and runs
 * SDPA on it: the keys are copied once, read again, and padded to the longest
 * context of the batch. Here each (sequence, kv head) walks its own blocks in
 * place, so the KV is read once and only up to each sequence's own length.
 *
 * Layouts (all contiguous):
 *   q, out        [num_seqs, num_heads, head_dim]
 *   k/v cache     [num_blocks, block_size, num_kv_heads, head_dim]  (one layer)
 *   block_tables  [num_seqs, max_blocks] int32, padded past a sequence's blocks
 *   context_lens  [num_seqs] int32, >= 1
 * Query head h reads kv head h / (num_heads / num_kv_heads), as transformers'
 * repeat_kv does.
 *
 * Built with -fopenmp and loaded after torch, so it shares torch's OpenMP
 * runtime and threads. -ffast-math (compile step only) lets gcc vectorise the
 * reductions and call glibc's vector expf; scores are finite and the softmax
 * subtracts its maximum, so nothing here needs IEEE inf/nan behaviour.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "paged_decode.h"

/* Always inlined, so that the call with a literal head_dim of 64 (SmolLM2, Llama,
 * Qwen: most small models) compiles to fixed, fully vectorised dot products. */
static inline __attribute__((always_inline)) void attend_one(const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *table, int64_t len, float *out, float *scores,
                       int64_t group, int64_t head_dim, int64_t block_size,
                       int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                       float scale)
{
    /* Pass 1: scores[g][t] = q_g . k_t * scale; each key is loaded once for the group. */
    for (int64_t start = 0; start < len; start += block_size) {
        const float *block = k_cache + (int64_t)table[start / block_size] * block_stride + kv_offset;
        int64_t n = len - start < block_size ? len - start : block_size;
        for (int64_t j = 0; j < n; j++) {
            const float *k = block + j * token_stride;
            for (int64_t g = 0; g < group; g++) {
                const float *qg = q + g * head_dim;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t i = 0; i < head_dim; i++)
                    acc += qg[i] * k[i];
                scores[g * len + start + j] = acc * scale;
            }
        }
    }
    /* Softmax per query head, normalised at the end of pass 2. */
    float inv_sum[group];
    for (int64_t g = 0; g < group; g++) {
        float *s = scores + g * len;
        float max = s[0];
        for (int64_t t = 1; t < len; t++)
            max = s[t] > max ? s[t] : max;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            s[t] = expf(s[t] - max);
            sum += s[t];
        }
        inv_sum[g] = 1.0f / sum;
    }
    /* Pass 2: out_g = sum_t p[g][t] v_t. */
    memset(out, 0, sizeof(float) * group * head_dim);
    for (int64_t start = 0; start < len; start += block_size) {
        const float *block = v_cache + (int64_t)table[start / block_size] * block_stride + kv_offset;
        int64_t n = len - start < block_size ? len - start : block_size;
        for (int64_t j = 0; j < n; j++) {
            const float *v = block + j * token_stride;
            for (int64_t g = 0; g < group; g++) {
                float p = scores[g * len + start + j];
                float *og = out + g * head_dim;
#pragma omp simd
                for (int64_t i = 0; i < head_dim; i++)
                    og[i] += p * v[i];
            }
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < head_dim; i++)
            out[g * head_dim + i] *= inv_sum[g];
}

void paged_decode_item(const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *table, int64_t len, float *out, float *scores,
                       int64_t group, int64_t head_dim, int64_t block_size, int64_t token_stride,
                       int64_t block_stride, int64_t kv_offset, float scale)
{
    if (head_dim == 64)
        attend_one(q, k_cache, v_cache, table, len, out, scores, group, 64, block_size,
                   token_stride, block_stride, kv_offset, scale);
    else
        attend_one(q, k_cache, v_cache, table, len, out, scores, group, head_dim, block_size,
                   token_stride, block_stride, kv_offset, scale);
}

/* Returns 0, or -1 when a thread could not allocate its score buffer. */
int paged_decode_attention(const float *q, const float *k_cache, const float *v_cache,
                           const int32_t *block_tables, const int32_t *context_lens,
                           float *out, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                           int64_t max_blocks, float scale)
{
    const int64_t group = num_heads / num_kv_heads;
    const int64_t token_stride = num_kv_heads * head_dim;
    const int64_t block_stride = block_size * token_stride;
    const int64_t max_len = max_blocks * block_size;
    int failed = 0;
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * group * max_len);
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* Dynamic: contexts differ, so equal shares of items are not equal work. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_seqs * num_kv_heads; item++) {
            if (scores == NULL)
                continue;
            int64_t seq = item / num_kv_heads, kv_head = item % num_kv_heads;
            int64_t first_head = seq * num_heads + kv_head * group;
            const float *q_item = q + first_head * head_dim;
            const int32_t *table = block_tables + seq * max_blocks;
            float *out_item = out + first_head * head_dim;
            paged_decode_item(q_item, k_cache, v_cache, table, context_lens[seq], out_item, scores,
                              group, head_dim, block_size, token_stride, block_stride,
                              kv_head * head_dim, scale);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
