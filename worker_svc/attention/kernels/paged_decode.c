/* Paged attention for decode tokens on the CPU, straight from the KV pool, which
 * holds float32 or float16 (binary16) keys and values; the arithmetic is float32.
 *
 * The torch backend gathers every decode's blocks into one padded tensor and runs
 * SDPA on it: the keys are copied once, read again, and padded to the longest
 * context of the batch. Here each (sequence, kv head) walks its own blocks in
 * place, so the KV is read once and only up to each sequence's own length.
 *
 * Layouts (all contiguous):
 *   q, out        [num_seqs, num_heads, head_dim]  float32
 *   k/v cache     [num_blocks, block_size, num_kv_heads, head_dim]  (one layer)
 *   block_tables  [num_seqs, max_blocks] int32, padded past a sequence's blocks
 *   context_lens  [num_seqs] int32, >= 1
 *   sinks         [num_heads] float32, or NULL: each head's sink logit (gpt-oss)
 * Query head h reads kv head h / (num_heads / num_kv_heads), as transformers'
 * repeat_kv does.
 *
 * Built with -fopenmp and loaded after torch, so it shares torch's OpenMP
 * runtime and threads. -ffast-math (compile step only) lets gcc vectorise the
 * reductions and call glibc's vector expf; scores are finite and the softmax
 * subtracts its maximum, so nothing here needs IEEE inf/nan behaviour. A float16
 * pool is widened a block at a time (half_convert.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "half_convert.h"
#include "paged_decode.h"

#define CACHE_LINE 64

/* `rows` rows of `row_bytes` each, `stride_bytes` apart, towards L1 (`far` 0) or L2
 * (`far` 1: for data wanted a block or a pass later, so L1 is not crowded). */
static inline void prefetch_rows_to(const void *first, int64_t rows, int64_t stride_bytes,
                                    int64_t row_bytes, int far)
{
    const char *row = first;
    for (int64_t j = 0; j < rows; j++, row += stride_bytes)
        for (int64_t offset = 0; offset < row_bytes; offset += CACHE_LINE) {
            if (far)
                __builtin_prefetch(row + offset, 0, 2);
            else
                __builtin_prefetch(row + offset, 0, 3);
        }
}

static inline void prefetch_rows(const void *first, int64_t rows, int64_t stride_bytes,
                                 int64_t row_bytes)
{
    prefetch_rows_to(first, rows, stride_bytes, row_bytes, 0);
}

/* Block b + 1's rows (its first `left` keys at most) into L1, where there is one. */
static inline void prefetch_next_block(const char *cache, int64_t elem, const int32_t *table,
                                       int64_t b, int64_t num_blocks, int64_t left,
                                       int64_t block_size, int64_t block_stride,
                                       int64_t kv_offset, int64_t stride_bytes, int64_t row_bytes)
{
    if (b + 1 < num_blocks)
        prefetch_rows(cache + ((int64_t)table[b + 1] * block_stride + kv_offset) * elem,
                      left < block_size ? left : block_size, stride_bytes, row_bytes);
}

#define prefetch_next(cache, ...)                                                              \
    prefetch_next_block((const char *)(cache), sizeof *(cache), __VA_ARGS__)

/* While block b's keys are scored (both kernels): the next block's key rows into L1, the
 * one after into L2, and block b's values into L2 for the value pass. A decode's KV comes
 * from memory (the weights stream through the caches between layers), and one block of
 * lookahead covers too little of a miss's latency. `elem` is the cache's element size;
 * block_stride and kv_offset count elements, the rest bytes. */
static inline void prefetch_block(const char *k_cache, const char *v_cache, int64_t elem,
                                  const int32_t *table, int64_t b, int64_t num_blocks,
                                  int64_t start, int64_t n, int64_t len, int64_t block_size,
                                  int64_t block_stride, int64_t kv_offset, int64_t stride_bytes,
                                  int64_t row_bytes)
{
    const int64_t left = len - start - n;
    prefetch_next_block(k_cache, elem, table, b, num_blocks, left, block_size, block_stride,
                        kv_offset, stride_bytes, row_bytes);
    if (b + 2 < num_blocks)
        prefetch_rows_to(k_cache + ((int64_t)table[b + 2] * block_stride + kv_offset) * elem,
                         left - block_size < block_size ? left - block_size : block_size,
                         stride_bytes, row_bytes, 1);
    prefetch_rows_to(v_cache + ((int64_t)table[b] * block_stride + kv_offset) * elem, n,
                     stride_bytes, row_bytes, 1);
}

#define prefetch_ahead(k_cache, v_cache, ...)                                                  \
    prefetch_block((const char *)(k_cache), (const char *)(v_cache), sizeof *(k_cache),      \
                   __VA_ARGS__)

/* Each query head's softmax over its `count` scores, in place, leaving exp(s - max); the
 * division by the sum waits for the end of the value pass (inv_sum). With `sinks` (one
 * logit per query head, gpt-oss) each head's sink joins the maximum and the sum but has
 * no value: its weight is left out of the output. With `stats` (a part of a split item)
 * each head's maximum and sum too, for the merge. */
static inline void softmax_scores(float *scores, int64_t count, int64_t group, float *inv_sum,
                                  float *stats, const float *sinks)
{
    for (int64_t g = 0; g < group; g++) {
        float *s = scores + g * count;
        float max = sinks && sinks[g] > s[0] ? sinks[g] : s[0];
        for (int64_t t = 1; t < count; t++)
            max = s[t] > max ? s[t] : max;
        float sum = sinks ? expf(sinks[g] - max) : 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < count; t++) {
            s[t] = expf(s[t] - max);
            sum += s[t];
        }
        inv_sum[g] = 1.0f / sum;
        if (stats) {
            stats[2 * g] = max;
            stats[2 * g + 1] = sum;
        }
    }
}

/* A float32 block's rows are read where they lie. */
static inline const float *rows_f32(const float *block, int64_t n, int64_t token_stride,
                                    int64_t head_dim, float *buffer, int64_t *stride)
{
    (void)n, (void)head_dim, (void)buffer;
    *stride = token_stride;
    return block;
}

/* A float16 block's rows are widened once into `buffer`, then read by every query head. */
static inline const float *rows_f16(const uint16_t *block, int64_t n, int64_t token_stride,
                                    int64_t head_dim, float *buffer, int64_t *stride)
{
    for (int64_t j = 0; j < n; j++)
        half_row_to_float(block + j * token_stride, buffer + j * head_dim, head_dim);
    *stride = head_dim;
    return buffer;
}

#define KV_T float
#define KV_ROWS rows_f32
#define ATTEND_NAME attend_f32
#include "paged_decode_attend.h"
#undef KV_T
#undef KV_ROWS
#undef ATTEND_NAME

#if defined(__AVX512F__)
#include "paged_decode_f16_avx512.h"
#endif

#define KV_T uint16_t
#define KV_ROWS rows_f16
#define ATTEND_NAME attend_f16
#include "paged_decode_attend.h"
#undef KV_T
#undef KV_ROWS
#undef ATTEND_NAME

/* The call with a literal head_dim of 64 (SmolLM2, Llama, Qwen: most small models)
 * compiles to fixed, fully vectorised dot products. */
void paged_decode_item_sinks(const float *q, const float *k_cache, const float *v_cache,
                             const int32_t *table, int64_t first, int64_t len, float *out,
                             float *scores, int64_t group, int64_t head_dim, int64_t block_size,
                             int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                             float scale, float *stats, const float *sinks)
{
    if (head_dim == 64)
        attend_f32(q, k_cache, v_cache, table, first, len, out, scores, group, 64, block_size,
                   token_stride, block_stride, kv_offset, scale, stats, sinks);
    else
        attend_f32(q, k_cache, v_cache, table, first, len, out, scores, group, head_dim,
                   block_size, token_stride, block_stride, kv_offset, scale, stats, sinks);
}

void paged_decode_item_f16_sinks(const float *q, const uint16_t *k_cache,
                                 const uint16_t *v_cache, const int32_t *table, int64_t first,
                                 int64_t len, float *out, float *scores, int64_t group,
                                 int64_t head_dim, int64_t block_size, int64_t token_stride,
                                 int64_t block_stride, int64_t kv_offset, float scale,
                                 float *stats, const float *sinks)
{
#if defined(__AVX512F__)
    if (attend_f16_avx512(q, k_cache, v_cache, table, first, len, out, scores, group, head_dim,
                          block_size, token_stride, block_stride, kv_offset, scale, stats,
                          sinks))
        return;
#endif
    if (head_dim == 64)
        attend_f16(q, k_cache, v_cache, table, first, len, out, scores, group, 64, block_size,
                   token_stride, block_stride, kv_offset, scale, stats, sinks);
    else
        attend_f16(q, k_cache, v_cache, table, first, len, out, scores, group, head_dim,
                   block_size, token_stride, block_stride, kv_offset, scale, stats, sinks);
}

void paged_decode_item(const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *table, int64_t first, int64_t len, float *out,
                       float *scores, int64_t group, int64_t head_dim, int64_t block_size, int64_t token_stride,
                       int64_t block_stride, int64_t kv_offset, float scale, float *stats)
{
    paged_decode_item_sinks(q, k_cache, v_cache, table, first, len, out, scores, group,
                            head_dim, block_size, token_stride, block_stride, kv_offset, scale,
                            stats, NULL);
}

void paged_decode_item_f16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                           const int32_t *table, int64_t first, int64_t len, float *out,
                           float *scores, int64_t group, int64_t head_dim, int64_t block_size,
                           int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                           float scale, float *stats)
{
    paged_decode_item_f16_sinks(q, k_cache, v_cache, table, first, len, out, scores, group,
                                head_dim, block_size, token_stride, block_stride, kv_offset,
                                scale, stats, NULL);
}

/* Every (sequence, kv head) of the batch over the OpenMP team; `half` picks the cache
 * element type; `sinks` is [num_heads] or NULL. Returns 0, or -1 when a thread could not
 * allocate its score buffer. */
static int attend_batch(const float *q, const void *k_cache, const void *v_cache, int half,
                        const int32_t *block_tables, const int32_t *context_lens, float *out,
                        int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                        int64_t head_dim, int64_t block_size, int64_t max_blocks, int64_t window,
                        float scale, const float *sinks)
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
            const int64_t len = context_lens[seq];
            const int64_t first = window > 0 && len > window ? len - window : 0;
            const float *item_sinks = sinks ? sinks + kv_head * group : NULL;
            if (half)
                paged_decode_item_f16_sinks(q_item, k_cache, v_cache, table, first, len,
                                            out_item, scores, group, head_dim, block_size,
                                            token_stride, block_stride, kv_head * head_dim,
                                            scale, NULL, item_sinks);
            else
                paged_decode_item_sinks(q_item, k_cache, v_cache, table, first, len, out_item,
                                        scores, group, head_dim, block_size, token_stride,
                                        block_stride, kv_head * head_dim, scale, NULL,
                                        item_sinks);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}

int paged_decode_attention(const float *q, const float *k_cache, const float *v_cache,
                           const int32_t *block_tables, const int32_t *context_lens,
                           float *out, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                           int64_t max_blocks, int64_t window, float scale, const float *sinks)
{
    return attend_batch(q, k_cache, v_cache, 0, block_tables, context_lens, out, num_seqs,
                        num_heads, num_kv_heads, head_dim, block_size, max_blocks, window, scale,
                        sinks);
}

int paged_decode_attention_f16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens,
                               float *out, int64_t num_seqs, int64_t num_heads,
                               int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                               int64_t max_blocks, int64_t window, float scale,
                               const float *sinks)
{
    return attend_batch(q, k_cache, v_cache, 1, block_tables, context_lens, out, num_seqs,
                        num_heads, num_kv_heads, head_dim, block_size, max_blocks, window, scale,
                        sinks);
}
