/* y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF's own quantized blocks, x and y float32.
 *
 * Formats, one block = 32 consecutive weights of a row (K is a multiple of 32):
 *   Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; byte j holds weight j in its
 *        low nibble and weight j + 16 in its high one; w = d * q + m.
 *   Q8_0 (34 bytes): f16 d, 32 int8; w = d * q.
 * Each weight is the value gguf's dequantizer computes (float32 d * q, then + m), so
 * the kernel multiplies by exactly the float32 model's weights; only the order of the
 * sums differs from torch's matmul. d has 11 significant bits and q at most 8, so d * q
 * is exact in float32 and fma(d, q, m) rounds once, as the separate add does: the
 * vector variants may fuse it (and Q4_1's AVX-512 path reads its 16 possible values
 * from a table made by one FMA a block).
 *
 * Work: threads share panels of output rows. A panel's rows are dequantized once into
 * a per-thread buffer, then every row of x is multiplied by them in 4 x 4 register
 * blocks (4 x 2 rows x 4 with AVX2). At M = 1 the
 * step reads each weight byte once (memory bound, a sixth of float32's bytes); at large
 * M the dequantization is paid once per tile, not once per row of x.
 *
 * Q4_K, Q5_K, Q6_K and Q5_0 are read by qblock_kquants.c (plain C) and
 * qblock_kquants_avx512.c, linked with this file: this file's panels, tiles and dispatch
 * serve every format, and only the unpacking of a block is per format.
 *
 * Variants (chosen per call; 0 = the best this CPU runs): 1 plain C, 2 AVX2+FMA+F16C,
 * 3 AVX-512 (F, BW, VL). Compiled with -ffp-contract=off: fusing is the kernel's choice
 * where it is exact (above), never the compiler's.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "qblock_gemm.h"
#include "qblock_half.h"
#include "qblock_kquants.h"

enum { FORMAT_Q4_1 = QBLOCK_FORMAT_Q4_1, FORMAT_Q8_0 = QBLOCK_FORMAT_Q8_0 };
enum { VARIANT_AUTO = 0, VARIANT_PLAIN = 1, VARIANT_AVX2 = 2, VARIANT_AVX512 = 3 };
enum { Q4_1_BYTES = 20, Q8_0_BYTES = 34, QK = 32 };

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* IEEE half to float, exact for every input (subnormals included), without F16C. */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: normalise into a float */
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* Every half's float value (qblock_half.h), filled when the library loads. A block's
 * scale and minimum are read from here rather than converted with F16C: _cvtsh_ss and
 * the broadcast of its result cost 2 uops each on the shuffle port (port 5 on Intel),
 * which the nibble unpacking and the table lookups already saturate at M = 1, while
 * a broadcast from memory is a load. The values the blocks use are few (scales of
 * one model), so the lines they touch stay in L1. */
float qblock_half_values[1 << 16];

__attribute__((constructor)) static void fill_half_values(void)
{
    for (uint32_t h = 0; h < (1u << 16); h++)
        qblock_half_values[h] = half_to_float((uint16_t)h);
}

INLINE float half_value(const uint8_t *p)
{
    return qblock_half(p);
}

/* ---- plain C ------------------------------------------------------------------ */

static void dequant_plain(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            float d = half_to_float(qblock_load_u16(blk)), m = half_to_float(qblock_load_u16(blk + 2));
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(blk[4 + j] & 0x0f) + m;
                out[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
            }
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            float d = half_to_float(qblock_load_u16(blk));
            for (int j = 0; j < QK; j++)
                out[j] = d * (float)(int8_t)blk[2 + j];
        }
    }
}

static void tile_plain(const float *w, int64_t rows, const float *x, int64_t m_count, int64_t k,
                       float *y, int64_t ldy)
{
    for (int64_t i = 0; i < m_count; i++)
        for (int64_t r = 0; r < rows; r++) {
            const float *wr = w + r * k, *xi = x + i * k;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < k; j++)
                acc += wr[j] * xi[j];
            y[i * ldy + r] = acc;
        }
}

/* ---- AVX2 --------------------------------------------------------------------- */

AVX2_TARGET static void dequant_avx2(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            __m256 d = _mm256_set1_ps(half_value(blk));
            __m256 m = _mm256_set1_ps(half_value(blk + 2));
            __m128i q = _mm_loadu_si128((const __m128i *)(blk + 4));
            __m256i lo8 = _mm256_cvtepu8_epi32(q), hi8 = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
            __m256i nib = _mm256_set1_epi32(0x0f);
            __m256i parts[4] = {_mm256_and_si256(lo8, nib), _mm256_and_si256(hi8, nib),
                                _mm256_srli_epi32(lo8, 4), _mm256_srli_epi32(hi8, 4)};
            for (int p = 0; p < 4; p++)
                _mm256_storeu_ps(out + 8 * p, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(parts[p]), m));
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            __m256 d = _mm256_set1_ps(half_value(blk));
            for (int p = 0; p < 4; p++) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * p)));
                _mm256_storeu_ps(out + 8 * p, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
    }
}

AVX2_TARGET INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* RR weight rows x MM rows of x, both constants after inlining: 2 x 4 accumulators. */
AVX2_TARGET INLINE void block_avx2(const float *w, const float *x, int64_t k, float *y,
                                   int64_t ldy, const int RR, const int MM)
{
    __m256 acc[2][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j += 8) {
        __m256 wv[2];
        for (int r = 0; r < RR; r++)
            wv[r] = _mm256_loadu_ps(w + r * k + j);
        for (int i = 0; i < MM; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * k + j);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = hsum256(acc[r][i]);
}

AVX2_TARGET static void tile_avx2(const float *w, int64_t rows, const float *x, int64_t m_count,
                                  int64_t k, float *y, int64_t ldy)
{
    for (int64_t r = 0; r < rows; r += 2) {
        int two = rows - r >= 2;
        int64_t i = 0;
        for (; i + 4 <= m_count; i += 4)
            two ? block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 2, 4)
                : block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 4);
        for (; i < m_count; i++)
            two ? block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 2, 1)
                : block_avx2(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 1);
    }
}

/* ---- AVX-512 ------------------------------------------------------------------ */

/* A Q4_1 block's 32 weights: its 16 possible values d * q + m (one FMA over 0..15),
 * picked by each nibble (vpermps reads only an index's low 4 bits: no mask needed). */
AVX512_TARGET INLINE void q4_1_regs_avx512(const uint8_t *blk, __m512 *lo, __m512 *hi)
{
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(half_value(blk)), levels,
                                   _mm512_set1_ps(half_value(blk + 2)));
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
    *lo = _mm512_permutexvar_ps(q, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
}

AVX512_TARGET static void dequant_avx512(int format, const uint8_t *row, int64_t k, float *out)
{
    for (int64_t b = 0; b < k / QK; b++, out += QK) {
        if (format == FORMAT_Q4_1) {
            const uint8_t *blk = row + b * Q4_1_BYTES;
            __m512 lo, hi;
            q4_1_regs_avx512(blk, &lo, &hi);
            _mm512_storeu_ps(out, lo);
            _mm512_storeu_ps(out + 16, hi);
        } else {
            const uint8_t *blk = row + b * Q8_0_BYTES;
            __m512 d = _mm512_set1_ps(half_value(blk));
            for (int p = 0; p < 2; p++) {
                __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * p)));
                _mm512_storeu_ps(out + 16 * p, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q)));
            }
        }
    }
}

/* RR weight rows x MM rows of x: up to 16 accumulators, 4 weight and 1 x register. */
AVX512_TARGET INLINE void block_avx512(const float *w, const float *x, int64_t k, float *y,
                                       int64_t ldy, const int RR, const int MM)
{
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 16) {
        __m512 wv[4];
        for (int r = 0; r < RR; r++)
            wv[r] = _mm512_loadu_ps(w + r * k + j);
        for (int i = 0; i < MM; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * k + j);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

AVX512_TARGET static void tile_avx512(const float *w, int64_t rows, const float *x,
                                      int64_t m_count, int64_t k, float *y, int64_t ldy)
{
    if (rows == 4) {
        int64_t i = 0;
        for (; i + 4 <= m_count; i += 4)
            block_avx512(w, x + i * k, k, y + i * ldy, ldy, 4, 4);
        for (; i < m_count; i++)
            block_avx512(w, x + i * k, k, y + i * ldy, ldy, 4, 1);
        return;
    }
    for (int64_t r = 0; r < rows; r++) /* a last, partial tile */
        for (int64_t i = 0; i < m_count; i++)
            block_avx512(w + r * k, x + i * k, k, y + i * ldy + r, ldy, 1, 1);
}

/* Small M (a decode of a few sequences): no buffer. Each block of RR rows is
 * dequantized into registers and used at once by the MM rows of x, so the weights go
 * from memory to the FMAs without a store and a reload. */
AVX512_TARGET INLINE void block_regs_avx512(const uint8_t *blk, const int FORMAT, __m512 *lo,
                                            __m512 *hi)
{
    if (FORMAT == FORMAT_Q4_1) {
        q4_1_regs_avx512(blk, lo, hi);
    } else {
        __m512 d = _mm512_set1_ps(half_value(blk));
        *lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(
                                   _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
        *hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(
                                   _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
    }
}

AVX512_TARGET INLINE void small_avx512(const uint8_t *w, int64_t row_bytes, const float *x,
                                       int64_t k, float *y, int64_t ldy, const int FORMAT,
                                       const int RR, const int MM)
{
    const int bytes = FORMAT == FORMAT_Q4_1 ? Q4_1_BYTES : Q8_0_BYTES;
    __m512 acc[4][4];
    for (int r = 0; r < RR; r++)
        for (int i = 0; i < MM; i++)
            acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK; b++) {
        __m512 lo[4], hi[4];
        for (int r = 0; r < RR; r++) {
            /* The next tile's rows, a block at a time: out-of-cache weights (the LM head)
             * arrive at twice the rate with this lookahead (measured). A prefetch past
             * the end of the weights is harmless: it never faults. */
            _mm_prefetch((const char *)(w + (RR + r) * row_bytes + b * bytes), _MM_HINT_T0);
            block_regs_avx512(w + r * row_bytes + b * bytes, FORMAT, &lo[r], &hi[r]);
        }
        for (int i = 0; i < MM; i++) {
            __m512 x0 = _mm512_loadu_ps(x + i * k + b * QK), x1 = _mm512_loadu_ps(x + i * k + b * QK + 16);
            for (int r = 0; r < RR; r++)
                acc[r][i] = _mm512_fmadd_ps(hi[r], x1, _mm512_fmadd_ps(lo[r], x0, acc[r][i]));
        }
    }
    for (int i = 0; i < MM; i++)
        for (int r = 0; r < RR; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#define SMALL_CASES(FORMAT)                                                                       \
    switch (m_count * 8 + (rows == 4 ? 4 : 1)) {                                                  \
    case 12: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1); break;                       \
    case 20: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2); break;                       \
    case 28: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 3); break;                       \
    case 36: small_avx512(w, row_bytes, x, k, y, ldy, FORMAT, 4, 4); break;                       \
    default:                                                                                      \
        for (int64_t r = 0; r < rows; r++)                                                        \
            for (int64_t i = 0; i < m_count; i++)                                                 \
                small_avx512(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy,    \
                             FORMAT, 1, 1);                                                       \
    }

/* rows <= 4 weight rows times m_count <= SMALL_M rows of x. */
AVX512_TARGET static void small_tile_avx512(int format, const uint8_t *w, int64_t row_bytes,
                                            int64_t rows, const float *x, int64_t m_count,
                                            int64_t k, float *y, int64_t ldy)
{
    if (format == FORMAT_Q4_1) {
        SMALL_CASES(FORMAT_Q4_1)
    } else {
        SMALL_CASES(FORMAT_Q8_0)
    }
}

/* ---- dispatch ----------------------------------------------------------------- */

/* A thread's unit of work: PANEL_ROWS output rows, dequantized together (at most
 * 192 KB for K = 1536: L2-resident). x is taken in chunks of X_CHUNK rows, each reused
 * by the panel's TILE_ROWS-row tiles while it is in L2; a tile's weights (at most 24 KB)
 * stay in L1 across the chunk's rows. */
enum { PANEL_ROWS = QBLOCK_PANEL_ROWS, TILE_ROWS = 4, X_CHUNK = 64, SMALL_M = 4 };

static void tile(int variant, const float *w, int64_t rows, const float *x, int64_t m_count,
                 int64_t k, float *y, int64_t ldy)
{
    if (variant == VARIANT_AVX512)
        tile_avx512(w, rows, x, m_count, k, y, ldy);
    else if (variant == VARIANT_AVX2)
        tile_avx2(w, rows, x, m_count, k, y, ldy);
    else
        tile_plain(w, rows, x, m_count, k, y, ldy);
}

static void dequant(int variant, int format, const uint8_t *row, int64_t k, float *out)
{
    /* The other formats have no AVX2 unpacking (yet): AVX2 runs their plain C one, then
     * its own float tiles. */
    if (kq_is_kquant_format(format))
        variant == VARIANT_AVX512 ? kq_dequant_avx512(format, row, k, out)
                                  : kq_dequant_plain(format, row, k, out);
    else if (variant == VARIANT_AVX512)
        dequant_avx512(format, row, k, out);
    else if (variant == VARIANT_AVX2)
        dequant_avx2(format, row, k, out);
    else
        dequant_plain(format, row, k, out);
}

int qblock_supported_variants(void)
{
    __builtin_cpu_init();
    int mask = 1 << VARIANT_PLAIN;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        mask |= 1 << VARIANT_AVX2; /* F16C comes with every AVX2 CPU */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        mask |= 1 << VARIANT_AVX512;
    return mask;
}

int qblock_resolve_variant(int variant)
{
    int mask = qblock_supported_variants();
    if (variant == VARIANT_AUTO)
        variant = (mask & (1 << VARIANT_AVX512)) ? VARIANT_AVX512
                  : (mask & (1 << VARIANT_AVX2)) ? VARIANT_AVX2
                                                 : VARIANT_PLAIN;
    if (variant < VARIANT_PLAIN || variant > VARIANT_AVX512 || !(mask & (1 << variant)))
        return -1;
    return variant;
}

/* Weights and bytes of one block (or super-block) of each format, by code. */
static const int64_t GROUP_WEIGHTS[QBLOCK_FORMATS] = {32, 32, 256, 256, 256, 32};
static const int64_t GROUP_BYTES[QBLOCK_FORMATS] = {Q4_1_BYTES, Q8_0_BYTES, 144, 176, 210, 22};

int64_t qblock_row_bytes(int format, int64_t k)
{
    return k / GROUP_WEIGHTS[format] * GROUP_BYTES[format];
}

int qblock_format_fits(int format, int64_t k)
{
    return format >= 0 && format < QBLOCK_FORMATS && k % GROUP_WEIGHTS[format] == 0;
}

void qblock_panel(int variant, int format, const uint8_t *w, int64_t first, int64_t rows,
                  const float *x, int64_t m_count, int64_t k, float *y, int64_t ldy, float *buf)
{
    const int64_t row_bytes = qblock_row_bytes(format, k);
    if (variant == VARIANT_AVX512 && m_count <= SMALL_M) {
        void (*small)(int, const uint8_t *, int64_t, int64_t, const float *, int64_t, int64_t,
                      float *, int64_t) =
            kq_is_kquant_format(format) ? kq_small_tile_avx512 : small_tile_avx512;
        for (int64_t r = 0; r < rows; r += TILE_ROWS)
            small(format, w + (first + r) * row_bytes, row_bytes,
                              rows - r < TILE_ROWS ? rows - r : TILE_ROWS, x, m_count, k,
                              y + first + r, ldy);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        dequant(variant, format, w + (first + r) * row_bytes, k, buf + r * k);
    for (int64_t i = 0; i < m_count; i += X_CHUNK) {
        int64_t chunk = m_count - i < X_CHUNK ? m_count - i : X_CHUNK;
        for (int64_t r = 0; r < rows; r += TILE_ROWS)
            tile(variant, buf + r * k, rows - r < TILE_ROWS ? rows - r : TILE_ROWS, x + i * k,
                 chunk, k, y + i * ldy + first + r, ldy);
    }
}

/* Returns 0; -1 for a variant this CPU lacks, -2 for a bad shape or format, -3 when a
 * buffer could not be allocated. */
int qblock_gemm(int format, int variant, const uint8_t *w, const float *x, float *y,
                int64_t m_count, int64_t n, int64_t k, int threads)
{
    variant = qblock_resolve_variant(variant);
    if (variant < 0)
        return -1;
    if (!qblock_format_fits(format, k) || m_count < 0 || n < 0)
        return -2;
    const int64_t panels = (n + PANEL_ROWS - 1) / PANEL_ROWS;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *buf = aligned_alloc(64, sizeof(float) * PANEL_ROWS * k + 64);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* Dynamic: on a shared machine a thread may lose its core for a while; the
         * others then take its panels instead of waiting for it at the end. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < panels; p++) {
            if (buf == NULL)
                continue;
            int64_t first = p * PANEL_ROWS;
            qblock_panel(variant, format, w, first, n - first < PANEL_ROWS ? n - first : PANEL_ROWS,
                         x, m_count, k, y, n, buf);
        }
        free(buf);
    }
    return failed ? -3 : 0;
}

/* Dequantizes n rows into out[n, k] (row-parallel): large-M calls hand the result to
 * torch's GEMM a chunk of rows at a time, and the tests use it as their reference. */
int qblock_dequantize(int format, int variant, const uint8_t *w, float *out, int64_t n,
                      int64_t k, int threads)
{
    variant = qblock_resolve_variant(variant);
    if (variant < 0)
        return -1;
    if (!qblock_format_fits(format, k))
        return -2;
    const int64_t row_bytes = qblock_row_bytes(format, k);
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t r = 0; r < n; r++)
        dequant(variant, format, w + r * row_bytes, k, out + r * k);
    return 0;
}
