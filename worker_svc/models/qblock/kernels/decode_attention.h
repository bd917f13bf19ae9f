/* The native decode step's attention (decode_step.c): each (token, kv head) item's query
 * and key made ready and its K/V written to the pool, then the item's query heads over
 * its sequence's cached K/V (the paged-decode kernel's own loop).
 *
 * Split items. Threads share out items, so a step with fewer items than about two a
 * thread leaves threads idle: one sequence of SmolLM2 (3 kv heads) on 2 threads took two
 * rounds of items where one and a half would do, and a model with 1 kv head ran its
 * attention on one thread. Then each item's keys are cut into `parts` runs of whole
 * blocks; each part is attended alone (its own softmax, with its maximum and sum kept),
 * and the thread that finishes an item's last part merges them, weighting each by
 * exp(max_p - max) * sum_p (flash-decoding's split-K). Only the order of the sums
 * changes. Every item's K/V is written before any part attends (one more barrier).
 */
#ifndef CBSERVE_DECODE_ATTENTION_H
#define CBSERVE_DECODE_ATTENTION_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "../../../attention/kernels/half_convert.h"
#include "../../../attention/kernels/paged_decode.h"
#include "decode_model.h"
#include "decode_rows.h"

/* A part attends at least this many keys: shorter ones cost more to merge than they save. */
enum { MIN_PART_KEYS = 64, MAX_PARTS = 8 };

/* The split of this step's items: parts per item (1: none) and the merge's scratch. */
struct attention_split {
    int64_t parts;
    float *partials;       /* [items * parts][group * head_dim]: each part's output */
    float *stats;          /* [items * parts][2 * group]: each part's maxima and sums */
    atomic_int *remaining; /* [layers * items]: parts not finished yet */
};

/* Parts per item for a step of `items` items on `threads` threads, the longest context
 * `longest` keys: enough that each thread gets about two units, each unit at least
 * MIN_PART_KEYS keys. */
static int64_t attention_parts(int64_t items, int threads, int64_t longest)
{
    if (items >= 2 * (int64_t)threads)
        return 1;
    int64_t parts = (2 * (int64_t)threads + items - 1) / items;
    int64_t most = longest / MIN_PART_KEYS;
    parts = parts < most ? parts : most;
    parts = parts < MAX_PARTS ? parts : MAX_PARTS;
    return parts > 1 ? parts : 1;
}

/* One (token, kv head) item's query and key, made ready in place (bias, per-head norms,
 * rotary: the Python forward's order), and its K/V written to the pool. */
static void prepare_item(const struct decode_model *m, const struct decode_batch *b,
                         int64_t layer, int64_t t, int64_t kv_head, float *qkv_row)
{
    const int64_t d = m->head_dim, group = m->num_heads / m->num_kv_heads;
    const int64_t token_stride = m->num_kv_heads * d, block_stride = b->block_size * token_stride;
    const int64_t layer_elements = b->num_blocks * block_stride;
    const int64_t q_at = kv_head * group * d, k_at = (m->num_heads + kv_head) * d;
    const int64_t v_at = (m->num_heads + m->num_kv_heads + kv_head) * d;
    float *q = qkv_row + q_at, *k = qkv_row + k_at, *v = qkv_row + v_at;
    const float *bias = (const float *)m->qkv_biases[layer];
    if (bias) {
        add_row(q, bias + q_at, group * d);
        add_row(k, bias + k_at, d);
        add_row(v, bias + v_at, d);
    }
    const float *q_norm = (const float *)m->qk_norms[layer * 2];
    if (q_norm) {
        const float *k_norm = (const float *)m->qk_norms[layer * 2 + 1], eps = (float)m->eps;
        for (int64_t g = 0; g < group; g++)
            rms_norm(q + g * d, q_norm, d, eps, q + g * d);
        rms_norm(k, k_norm, d, eps, k);
    }
    const int64_t half = d / 2, position = b->positions[t];
    const float *cos = (const float *)m->rope_tables[layer * 2] + position * half;
    const float *sin = (const float *)m->rope_tables[layer * 2 + 1] + position * half;
    rotate(q, group, d, cos, sin);
    rotate(k, 1, d, cos, sin);
    const int64_t slot_offset = b->slot_mapping[t] * token_stride + kv_head * d;
    const int64_t layer_at = 2 * layer * layer_elements; /* this layer's K, then its V */
    if (b->kv_dtype == KV_FLOAT16) {
        uint16_t *k_cache = (uint16_t *)b->kv_cache + layer_at, *v_cache = k_cache + layer_elements;
        float_row_to_half(k, k_cache + slot_offset, d);
        float_row_to_half(v, v_cache + slot_offset, d);
    } else {
        float *k_cache = (float *)b->kv_cache + layer_at, *v_cache = k_cache + layer_elements;
        memcpy(k_cache + slot_offset, k, sizeof(float) * d);
        memcpy(v_cache + slot_offset, v, sizeof(float) * d);
    }
}

/* The layer's sink logits of kv head `kv_head`'s query heads (gpt-oss), or NULL. */
static const float *item_sinks(const struct decode_model *m, int64_t layer, int64_t kv_head)
{
    const float *sinks = (const float *)m->sinks[layer];
    return sinks ? sinks + kv_head * (m->num_heads / m->num_kv_heads) : NULL;
}

/* Keys first .. len - 1 of item (t, kv_head)'s query heads into out[group, head_dim]; with
 * stats, their maxima and sums too; with sinks, each head's sink joins its softmax
 * (paged_decode.h). */
static void attend_range(const struct decode_model *m, const struct decode_batch *b,
                         int64_t layer, int64_t t, int64_t kv_head, const float *qkv_row,
                         int64_t first, int64_t len, float *out, float *scores, float *stats,
                         const float *sinks)
{
    const int64_t d = m->head_dim, group = m->num_heads / m->num_kv_heads;
    const int64_t token_stride = m->num_kv_heads * d, block_stride = b->block_size * token_stride;
    const int64_t layer_elements = b->num_blocks * block_stride;
    const float *q = qkv_row + kv_head * group * d;
    const int64_t layer_at = 2 * layer * layer_elements;
    const int32_t *table = b->block_tables + t * b->max_blocks;
    const float scale = (float)m->scale;
    if (b->kv_dtype == KV_FLOAT16) {
        const uint16_t *k_cache = (const uint16_t *)b->kv_cache + layer_at;
        paged_decode_item_f16_sinks(q, k_cache, k_cache + layer_elements, table, first, len,
                                    out, scores, group, d, b->block_size, token_stride,
                                    block_stride, kv_head * d, scale, stats, sinks);
    } else {
        const float *k_cache = (const float *)b->kv_cache + layer_at;
        paged_decode_item_sinks(q, k_cache, k_cache + layer_elements, table, first, len, out,
                                scores, group, d, b->block_size, token_stride, block_stride,
                                kv_head * d, scale, stats, sinks);
    }
}

/* The keys item (t, layer) attends: from its window's start (0 without one) to its end. */
static int64_t first_key(const struct decode_model *m, const struct decode_batch *b,
                         int64_t layer, int64_t t)
{
    const int64_t len = b->context_lens[t], window = m->windows[layer];
    return window > 0 && len > window ? len - window : 0;
}

/* The item's query (prepared) over its sequence's cached K/V, this token's included. */
static void attend_prepared(const struct decode_model *m, const struct decode_batch *b,
                            int64_t layer, int64_t t, int64_t kv_head, const float *qkv_row,
                            float *attended_row, float *scores)
{
    const int64_t group = m->num_heads / m->num_kv_heads;
    attend_range(m, b, layer, t, kv_head, qkv_row, first_key(m, b, layer, t), b->context_lens[t],
                 attended_row + kv_head * group * m->head_dim, scores, NULL,
                 item_sinks(m, layer, kv_head));
}

/* Part `part` of item (t, kv_head): its run of whole blocks of the item's keys, into the
 * split's scratch (an empty run leaves a sum of 0, which the merge skips). Part 0, never
 * empty (every item attends its own token), takes the sinks: each part's sum is merged,
 * so the sink must be in exactly one of them. */
static void attend_part(const struct decode_model *m, const struct decode_batch *b,
                        int64_t layer, int64_t t, int64_t kv_head, const float *qkv_row,
                        const struct attention_split *split, int64_t unit, int64_t part,
                        float *scores)
{
    const int64_t group = m->num_heads / m->num_kv_heads, d = m->head_dim;
    const int64_t first = first_key(m, b, layer, t), len = b->context_lens[t];
    const int64_t bs = b->block_size, span = len - first;
    const int64_t run = ((span + split->parts - 1) / split->parts + bs - 1) / bs * bs;
    const int64_t lo = first + part * run, hi = lo + run < len ? lo + run : len;
    float *stats = split->stats + unit * 2 * group;
    if (lo >= hi) {
        for (int64_t g = 0; g < group; g++)
            stats[2 * g] = 0.0f, stats[2 * g + 1] = 0.0f;
        return;
    }
    attend_range(m, b, layer, t, kv_head, qkv_row, lo, hi, split->partials + unit * group * d,
                 scores, stats, part == 0 ? item_sinks(m, layer, kv_head) : NULL);
}

/* The item's parts (units first_unit ..) merged into out[group, head_dim]. */
static void merge_parts(const struct attention_split *split, int64_t first_unit, int64_t group,
                        int64_t d, float *out)
{
    for (int64_t g = 0; g < group; g++) {
        float most = -INFINITY;
        for (int64_t p = 0; p < split->parts; p++) {
            const float *stats = split->stats + (first_unit + p) * 2 * group + 2 * g;
            if (stats[1] > 0.0f && stats[0] > most)
                most = stats[0];
        }
        float *o = out + g * d, total = 0.0f;
        memset(o, 0, sizeof(float) * d);
        for (int64_t p = 0; p < split->parts; p++) {
            const float *stats = split->stats + (first_unit + p) * 2 * group + 2 * g;
            if (stats[1] <= 0.0f)
                continue;
            const float weight = expf(stats[0] - most) * stats[1];
            const float *part = split->partials + (first_unit + p) * group * d + g * d;
            for (int64_t i = 0; i < d; i++)
                o[i] += weight * part[i];
            total += weight;
        }
        const float inv = 1.0f / total;
        for (int64_t i = 0; i < d; i++)
            o[i] *= inv;
    }
}

/* Unit `unit` of a split layer: a part of an item, and the item's merge if it was the
 * item's last part to finish (the counter's acquire-release orders the partials). */
static void attend_unit(const struct decode_model *m, const struct decode_batch *b,
                        int64_t layer, int64_t unit, const struct attention_split *split,
                        const float *qkv, int64_t qkv_width, float *attended, int64_t q_width,
                        float *scores)
{
    const int64_t item = unit / split->parts, part = unit % split->parts;
    const int64_t t = item / m->num_kv_heads, kv_head = item % m->num_kv_heads;
    const int64_t group = m->num_heads / m->num_kv_heads, d = m->head_dim;
    attend_part(m, b, layer, t, kv_head, qkv + t * qkv_width, split, unit, part, scores);
    const int64_t items = b->num_tokens * m->num_kv_heads;
    atomic_int *remaining = split->remaining + layer * items + item;
    if (atomic_fetch_sub_explicit(remaining, 1, memory_order_acq_rel) == 1)
        merge_parts(split, item * split->parts, group, d,
                    attended + t * q_width + kv_head * group * d);
}

#endif
