/* The paged-decode kernel's per-item entry points, shared with the native decode step
 * (worker_svc/models/qblock/kernels/decode_step.c), which links paged_decode.c's object. */
#ifndef CBSERVE_PAGED_DECODE_H
#define CBSERVE_PAGED_DECODE_H

#include <stdint.h>

/* One (sequence, kv head): the `group` query heads q[group, head_dim] that share the kv
 * head attend over its first `len` keys and values, found through `table` in the
 * caches (one layer, [num_blocks, block_size, num_kv_heads, head_dim]), into
 * out[group, head_dim]. `scores` holds group * len floats. kv_offset = kv_head *
 * head_dim; token_stride = num_kv_heads * head_dim; block_stride = block_size *
 * token_stride (all in elements). Runs on the calling thread.
 * Keys first .. len - 1 are attended (a window's start, or a part of a split item);
 * with `stats` (2 * group floats) each query head's score maximum and its sum of
 * exp(score - maximum) are written there too, so that parts of one item can be
 * merged; NULL: not wanted. */
void paged_decode_item(const float *q, const float *k_cache, const float *v_cache,
                       const int32_t *table, int64_t first, int64_t len, float *out,
                       float *scores, int64_t group, int64_t head_dim, int64_t block_size, int64_t token_stride,
                       int64_t block_stride, int64_t kv_offset, float scale, float *stats);

/* The same over a float16 pool: the caches hold IEEE binary16 bits. */
void paged_decode_item_f16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                           const int32_t *table, int64_t first, int64_t len, float *out,
                           float *scores, int64_t group, int64_t head_dim, int64_t block_size,
                           int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                           float scale, float *stats);

/* The same two with attention sinks: `sinks` holds the item's `group` sink logits (one
 * per query head, gpt-oss), which join each head's softmax maximum and sum but carry no
 * value; NULL for none. With `stats`, the sums include the sink, so of the parts of a
 * split item exactly one is given the sinks (the merge then counts each sink once). */
void paged_decode_item_sinks(const float *q, const float *k_cache, const float *v_cache,
                             const int32_t *table, int64_t first, int64_t len, float *out,
                             float *scores, int64_t group, int64_t head_dim, int64_t block_size,
                             int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                             float scale, float *stats, const float *sinks);

void paged_decode_item_f16_sinks(const float *q, const uint16_t *k_cache,
                                 const uint16_t *v_cache, const int32_t *table, int64_t first,
                                 int64_t len, float *out, float *scores, int64_t group,
                                 int64_t head_dim, int64_t block_size, int64_t token_stride,
                                 int64_t block_stride, int64_t kv_offset, float scale,
                                 float *stats, const float *sinks);

#endif
