/* One (sequence, kv head) over a float16 pool with AVX-512, for head_dim 64 or 128:
 * the same keys, softmax and values as paged_decode_attend.h, with the keys and values
 * widened in registers and the dot products' sums taken 16 keys at a time.
 *
 * Why (perf on a Zen 4, 64 decodes of ~300 tokens, SmolLM2's 9/3 heads: attention was
 * 29% of a 130 ms step): the generic loop widened every key and value row into a
 * buffer and read it back once per query head, and ended each key's 64-wide dot product
 * with a horizontal sum of its own (about as many instructions as the product). Here a
 * row is widened once into registers that all of the item's query heads use; a
 * product is left as 16 lane sums, and the lane sums of 16 keys are added up together
 * (sum16: 45 instructions for 16 keys, not 16 reductions of ~8). The value pass keeps
 * every query head's output row in registers through a block, loading each value row
 * once. Only the order of the float32 sums changes.
 *
 * Query heads go HEADS at a time, HEADS * head_dim / 16 <= 16 registers (the other 16
 * hold a row and the sums), so a group of up to 4 heads of 64 (2 of 128) reads its KV
 * once; a larger group reads it once per chunk of heads. paged_decode.c includes this
 * file where the compiler targets AVX-512 (-march=native on such a CPU).
 */
#include <immintrin.h>

/* Lane j of the result: the sum of v[j]'s 16 lanes. */
static inline __attribute__((always_inline)) __m512 sum16(const __m512 *v)
{
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: v[2i]'s sums at 0, 2; v[2i+1]'s at 1, 3 */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: v[4i .. 4i+3]'s sums in order */
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xee));
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                    _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                    _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

static inline __attribute__((always_inline)) __m512 half16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Scores of keys [skip, n) of one block (n <= 16 rows `row_stride` apart) for HEADS query
 * heads of D16 * 16 dims: s[g * count + j] = q_g . k_j * scale. */
static inline __attribute__((always_inline)) void block_scores_avx512(
    const __m512 *qv, const uint16_t *keys, int64_t row_stride, int64_t skip, int64_t n,
    float scale, float *s, int64_t count, const int HEADS, const int D16)
{
    __m512 partial[HEADS][16] __attribute__((aligned(64)));
    for (int64_t j = 0; j < 16; j++) {
        if (j >= n) { /* rows past the block's end: zeros, never stored */
            for (int g = 0; g < HEADS; g++)
                partial[g][j] = _mm512_setzero_ps();
            continue;
        }
        __m512 k[8];
        for (int c = 0; c < D16; c++)
            k[c] = half16(keys + j * row_stride + 16 * c);
        for (int g = 0; g < HEADS; g++) {
            __m512 acc = _mm512_mul_ps(qv[g * D16], k[0]);
            for (int c = 1; c < D16; c++)
                acc = _mm512_fmadd_ps(qv[g * D16 + c], k[c], acc);
            partial[g][j] = acc;
        }
    }
    const __mmask16 keep = (__mmask16)(((1u << n) - 1u) & ~((1u << skip) - 1u));
    for (int g = 0; g < HEADS; g++)
        _mm512_mask_storeu_ps(s + g * count, keep,
                              _mm512_mul_ps(sum16(partial[g]), _mm512_set1_ps(scale)));
}

/* out_g += sum over keys [skip, n) of p[g * count + j] * v_j for HEADS heads, the rows
 * accumulated in acc[HEADS * D16]. */
static inline __attribute__((always_inline)) void block_values_avx512(
    __m512 *acc, const uint16_t *values, int64_t row_stride, int64_t skip, int64_t n,
    const float *p, int64_t count, const int HEADS, const int D16)
{
    for (int64_t j = skip; j < n; j++) {
        __m512 v[8];
        for (int c = 0; c < D16; c++)
            v[c] = half16(values + j * row_stride + 16 * c);
        for (int g = 0; g < HEADS; g++) {
            const __m512 pj = _mm512_set1_ps(p[g * count + j]);
            for (int c = 0; c < D16; c++)
                acc[g * D16 + c] = _mm512_fmadd_ps(pj, v[c], acc[g * D16 + c]);
        }
    }
}

/* HEADS query heads (q, out: [HEADS, D16 * 16]) over keys first .. len - 1: scores into
 * scores[HEADS][count], their softmax (with stats), then the values. block_size <= 16. */
static inline __attribute__((always_inline)) void heads_avx512(
    const float *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *table,
    int64_t first, int64_t len, float *out, float *scores, int64_t block_size,
    int64_t token_stride, int64_t block_stride, int64_t kv_offset, float scale, float *stats,
    const float *sinks, const int HEADS, const int D16)
{
    const int64_t head_dim = 16 * D16, count = len - first;
    const int64_t first_block = first / block_size, num_blocks = (len + block_size - 1) / block_size;
    const int64_t row_bytes = head_dim * (int64_t)sizeof(uint16_t);
    const int64_t stride_bytes = token_stride * (int64_t)sizeof(uint16_t);
    __m512 qv[16];
    for (int g = 0; g < HEADS; g++)
        for (int c = 0; c < D16; c++)
            qv[g * D16 + c] = _mm512_loadu_ps(q + g * head_dim + 16 * c);
    for (int64_t b = first_block; b < num_blocks; b++) {
        const int64_t start = b * block_size;
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t skip = first > start ? first - start : 0;
        prefetch_ahead(k_cache, v_cache, table, b, num_blocks, start, n, len, block_size,
                       block_stride, kv_offset, stride_bytes, row_bytes);
        block_scores_avx512(qv, k_cache + (int64_t)table[b] * block_stride + kv_offset,
                            token_stride, skip, n, scale, scores + start - first, count, HEADS,
                            D16);
    }
    prefetch_rows(v_cache + (int64_t)table[first_block] * block_stride + kv_offset,
                  len - first_block * block_size < block_size ? len - first_block * block_size
                                                              : block_size,
                  stride_bytes, row_bytes);
    float inv_sum[4];
    softmax_scores(scores, count, HEADS, inv_sum, stats, sinks);
    __m512 acc[16];
    for (int i = 0; i < HEADS * D16; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = first_block; b < num_blocks; b++) {
        const int64_t start = b * block_size;
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t skip = first > start ? first - start : 0;
        prefetch_next(v_cache, table, b, num_blocks, len - start - n, block_size, block_stride,
                      kv_offset, stride_bytes, row_bytes);
        block_values_avx512(acc, v_cache + (int64_t)table[b] * block_stride + kv_offset,
                            token_stride, skip, n, scores + start - first, count, HEADS, D16);
    }
    for (int g = 0; g < HEADS; g++)
        for (int c = 0; c < D16; c++)
            _mm512_storeu_ps(out + g * head_dim + 16 * c,
                             _mm512_mul_ps(acc[g * D16 + c], _mm512_set1_ps(inv_sum[g])));
}

/* 1 when this kernel took the item (head_dim 64 or 128, blocks of at most 16 keys). */
static int attend_f16_avx512(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                             const int32_t *table, int64_t first, int64_t len, float *out,
                             float *scores, int64_t group, int64_t head_dim, int64_t block_size,
                             int64_t token_stride, int64_t block_stride, int64_t kv_offset,
                             float scale, float *stats, const float *sinks)
{
    if ((head_dim != 64 && head_dim != 128) || block_size > 16)
        return 0;
    const int64_t most = head_dim == 64 ? 4 : 2, count = len - first;
    for (int64_t g = 0; g < group; g += most) {
        const int heads = group - g < most ? (int)(group - g) : most;
        const float *qg = q + g * head_dim;
        float *og = out + g * head_dim, *sg = scores + g * count;
        float *st = stats ? stats + 2 * g : NULL;
        const float *sk = sinks ? sinks + g : NULL;
#define HEADS_CASE(H, D16)                                                                     \
    heads_avx512(qg, k_cache, v_cache, table, first, len, og, sg, block_size, token_stride,    \
                 block_stride, kv_offset, scale, st, sk, H, D16)
        if (head_dim == 64) {
            switch (heads) {
            case 1: HEADS_CASE(1, 4); break;
            case 2: HEADS_CASE(2, 4); break;
            case 3: HEADS_CASE(3, 4); break;
            default: HEADS_CASE(4, 4); break;
            }
        } else if (heads == 1) {
            HEADS_CASE(1, 8);
        } else {
            HEADS_CASE(2, 8);
        }
#undef HEADS_CASE
    }
    return 1;
}
