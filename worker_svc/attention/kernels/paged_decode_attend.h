/* One (sequence, kv head) of paged decode attention, written once for every cache
 * element type. paged_decode.c includes this file once per type, with
 *   KV_T         the cache element (float, or uint16_t holding binary16)
 *   KV_ROWS      a function giving a block's first n rows of one kv head as float32
 *                rows and their stride: the cache itself for float, widened into
 *                `buffer` for float16
 *   ATTEND_NAME  the name of the function to define
 * set; the arithmetic is float32 whatever the cache holds.
 *
 * Why it is shaped this way (measured on an Ice Lake Xeon, 64 decodes of ~450 tokens,
 * SmolLM2's 9/3 heads): the first version spent its time waiting on loads (perf put the
 * first key/value load of each token at the top), reaching 4-5 GB/s a thread against
 * ~23 GB/s the machine reads. A block's rows of one kv head are 16 strided runs of
 * head_dim values, which the hardware prefetcher follows poorly across 4 KiB pages and
 * scattered blocks. So each block prefetches the next block's rows of this kv head
 * while it computes, and the value pass keeps its output rows in registers through a
 * block instead of reading and writing them at every token.
 */

static inline __attribute__((always_inline)) void ATTEND_NAME(
    const float *q, const KV_T *k_cache, const KV_T *v_cache, const int32_t *table,
    int64_t first, int64_t len, float *out, float *scores, int64_t group, int64_t head_dim,
    int64_t block_size, int64_t token_stride, int64_t block_stride, int64_t kv_offset,
    float scale, float *stats, const float *sinks)
{
    /* Keys first .. len - 1 (a sliding window starts past 0); scores are indexed from
     * `first`, and a block's rows before it are read but not used. */
    const int64_t first_block = first / block_size;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    const int64_t count = len - first;
    const int64_t row_bytes = head_dim * (int64_t)sizeof(KV_T);
    float buffer[block_size * head_dim];
    int64_t stride;

    /* Pass 1: scores[g][t] = q_g . k_t * scale. */
    for (int64_t b = first_block; b < num_blocks; b++) {
        const KV_T *block = k_cache + (int64_t)table[b] * block_stride + kv_offset;
        const int64_t start = b * block_size;
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t skip = first > start ? first - start : 0;
        prefetch_ahead(k_cache, v_cache, table, b, num_blocks, start, n, len, block_size,
                       block_stride, kv_offset, token_stride * (int64_t)sizeof(KV_T), row_bytes);
        const float *keys = KV_ROWS(block, n, token_stride, head_dim, buffer, &stride);
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * head_dim;
            float *s = scores + g * count + start - first;
            for (int64_t j = skip; j < n; j++) {
                const float *k = keys + j * stride;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t i = 0; i < head_dim; i++)
                    acc += qg[i] * k[i];
                s[j] = acc * scale;
            }
        }
    }
    /* The first value block is needed next; fetch it while the softmax runs. */
    prefetch_rows(v_cache + (int64_t)table[first_block] * block_stride + kv_offset,
                  len - first_block * block_size < block_size ? len - first_block * block_size
                                                              : block_size,
                  token_stride * (int64_t)sizeof(KV_T), row_bytes);
    float inv_sum[group];
    softmax_scores(scores, count, group, inv_sum, stats, sinks);
    /* Pass 2: out_g = sum_t p[g][t] v_t, one block and one query head at a time so the
     * running row stays in registers across the block's tokens. */
    memset(out, 0, sizeof(float) * group * head_dim);
    for (int64_t b = first_block; b < num_blocks; b++) {
        const KV_T *block = v_cache + (int64_t)table[b] * block_stride + kv_offset;
        const int64_t start = b * block_size;
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t skip = first > start ? first - start : 0;
        prefetch_next(v_cache, table, b, num_blocks, len - start - n, block_size, block_stride,
                      kv_offset, token_stride * (int64_t)sizeof(KV_T), row_bytes);
        const float *values = KV_ROWS(block, n, token_stride, head_dim, buffer, &stride);
        for (int64_t g = 0; g < group; g++) {
            const float *p = scores + g * count + start - first;
            float acc[head_dim];
            float *og = out + g * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < head_dim; i++)
                acc[i] = og[i];
            for (int64_t j = skip; j < n; j++) {
                const float *v = values + j * stride;
                const float pj = p[j];
#pragma omp simd
                for (int64_t i = 0; i < head_dim; i++)
                    acc[i] += pj * v[i];
            }
#pragma omp simd
            for (int64_t i = 0; i < head_dim; i++)
                og[i] = acc[i];
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < head_dim; i++)
            out[g * head_dim + i] *= inv_sum[g];
}
