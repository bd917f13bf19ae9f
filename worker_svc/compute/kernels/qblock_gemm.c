/* y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF's quantized blocks, x and y float32:
 * the panels, the threads and the choice of code, for every format alike.
 *
 * Work: threads share panels of output rows. A panel's rows are dequantized once into
 * a per-thread buffer, then every row of x is multiplied by them in 4 x 4 register
 * blocks (4 x 2 rows x 4 with AVX2). At M = 1 the
 * step reads each weight byte once (memory bound, a sixth of float32's bytes); at large
 * M the dequantization is paid once per tile, not once per row of x. At small M on
 * AVX-512 (and for the K-quants on AVX2) there is no buffer: each format's small tile
 * unpacks its blocks into registers and multiplies them at once.
 *
 * Each weight is the value gguf's dequantizer computes, so the kernel multiplies by
 * exactly the float32 model's weights; only the order of the sums differs from
 * torch's matmul. The parts, linked together (compute/qblock.py PARTS):
 *   qblock_q4q8.c            Q4_1 and Q8_0 blocks unpacked (plain C, AVX2, AVX-512)
 *   qblock_kquants.c         Q4_K, Q5_K, Q6_K and Q5_0 unpacked in plain C
 *   qblock_kquants_avx2.c    the same with AVX2 (staged a group at a time)
 *   qblock_kquants_avx512.c  the same with AVX-512
 *   qblock_float16.c         F16 and BF16 widened (plain C, AVX2 with F16C, AVX-512)
 *   qblock_mxfp4.c           MXFP4 (gpt-oss's experts) unpacked (plain C, AVX2, AVX-512)
 *   qblock_tiles.c           the float tiles every format's unpacked rows go through
 *   this file                the dispatch, the entry points and the half table
 * Only the unpacking of a block is per format.
 *
 * Variants (chosen per call; 0 = the best this CPU runs): 1 plain C, 2 AVX2+FMA+F16C,
 * 3 AVX-512 (F, BW, VL). Compiled with -ffp-contract=off: fusing is the kernel's choice
 * where it is exact, never the compiler's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "qblock_float16.h"
#include "qblock_gemm.h"
#include "qblock_half.h"
#include "qblock_kquants.h"
#include "qblock_mxfp4.h"
#include "qblock_q4q8.h"
#include "qblock_tiles.h"

enum {
    VARIANT_AUTO = QBLOCK_VARIANT_AUTO,
    VARIANT_PLAIN = QBLOCK_VARIANT_PLAIN,
    VARIANT_AVX2 = QBLOCK_VARIANT_AVX2,
    VARIANT_AVX512 = QBLOCK_VARIANT_AVX512
};

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
        qblock_half_values[h] = qblock_half_to_float((uint16_t)h);
}

/* ---- dispatch ----------------------------------------------------------------- */

/* A thread's unit of work: PANEL_ROWS output rows, dequantized together (at most
 * 192 KB for K = 1536: L2-resident). x is taken in chunks of X_CHUNK rows, each reused
 * by the panel's TILE_ROWS-row tiles while it is in L2; a tile's weights (at most 24 KB)
 * stay in L1 across the chunk's rows. */
enum { PANEL_ROWS = QBLOCK_PANEL_ROWS, TILE_ROWS = 4, X_CHUNK = 64, SMALL_M = 4 };

static void dequant(int variant, int format, const uint8_t *row, int64_t k, float *out)
{
    if (f16_is_float16_format(format))
        variant == VARIANT_AVX512 ? f16_dequant_avx512(format, row, k, out)
        : variant == VARIANT_AVX2 ? f16_dequant_avx2(format, row, k, out)
                                  : f16_dequant_plain(format, row, k, out);
    else if (format == QBLOCK_FORMAT_MXFP4)
        variant == VARIANT_AVX512 ? mxfp4_dequant_avx512(row, k, out)
        : variant == VARIANT_AVX2 ? mxfp4_dequant_avx2(row, k, out)
                                  : mxfp4_dequant_plain(row, k, out);
    else if (kq_is_kquant_format(format))
        variant == VARIANT_AVX512 ? kq_dequant_avx512(format, row, k, out)
        : variant == VARIANT_AVX2 ? kq_dequant_avx2(format, row, k, out)
                                  : kq_dequant_plain(format, row, k, out);
    else if (variant == VARIANT_AVX512)
        q4q8_dequant_avx512(format, row, k, out);
    else if (variant == VARIANT_AVX2)
        q4q8_dequant_avx2(format, row, k, out);
    else
        q4q8_dequant_plain(format, row, k, out);
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
static const int64_t GROUP_WEIGHTS[QBLOCK_FORMATS] = {32, 32, 256, 256, 256, 32, 32, 32, 32};
static const int64_t GROUP_BYTES[QBLOCK_FORMATS] = {
    QBLOCK_Q4_1_BYTES, QBLOCK_Q8_0_BYTES, 144, 176, 210, 22, QBLOCK_FLOAT16_BYTES,
    QBLOCK_FLOAT16_BYTES, QBLOCK_MXFP4_BYTES};

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
    /* Q4_1 / Q8_0 on AVX2 go through the buffer (measured faster there); the K-quants'
     * and Q4_1 / Q8_0's AVX-512 tiles take up to 8 rows of x (measured faster than the
     * buffer at 5-8: a verify of one sequence's drafts is such a step); F16 and
     * BF16 widen in registers with AVX2 too (two instructions for 8 weights). */
    const int kquant = kq_is_kquant_format(format);
    const int float16 = f16_is_float16_format(format);
    const int mxfp4 = format == QBLOCK_FORMAT_MXFP4; /* buffered on AVX2, as Q4_1 / Q8_0 */
    const int64_t small_m = kquant    ? KQ_SMALL_M
                            : float16 ? SMALL_M
                            : mxfp4   ? MXFP4_SMALL_M
                                      : Q4Q8_SMALL_M;
    /* Up to two tiles' rows of x: the blocks are unpacked once a tile, which still costs
     * less than dequantizing the panel into the buffer and reading it back (a verify
     * step of one sequence and 8 drafts is 9 rows), except for Q5_K and Q6_K, whose
     * unpacking costs more (bench.micro.qblock_formats --rows 8,9,12,16 on a Zen 4:
     * Q4_1 at 12 rows 84 GFLOP/s against 70 through the buffer, Q6_K 62 against 65). */
    const int two_tiles = format != QBLOCK_FORMAT_Q5_K && format != QBLOCK_FORMAT_Q6_K;
    if (m_count <= (two_tiles ? 2 : 1) * small_m &&
        (variant == VARIANT_AVX512 || ((kquant || float16) && variant == VARIANT_AVX2))) {
        void (*small)(int, const uint8_t *, int64_t, int64_t, const float *, int64_t, int64_t,
                      float *, int64_t) =
            float16  ? (variant == VARIANT_AVX512 ? f16_small_tile_avx512 : f16_small_tile_avx2)
            : kquant ? (variant == VARIANT_AVX512 ? kq_small_tile_avx512 : kq_small_tile_avx2)
            : mxfp4  ? mxfp4_small_tile_avx512
                     : q4q8_small_tile_avx512;
        for (int64_t i = 0; i < m_count; i += small_m) {
            const int64_t chunk = m_count - i < small_m ? m_count - i : small_m;
            for (int64_t r = 0; r < rows; r += TILE_ROWS)
                small(format, w + (first + r) * row_bytes, row_bytes,
                      rows - r < TILE_ROWS ? rows - r : TILE_ROWS, x + i * k, chunk, k,
                      y + i * ldy + first + r, ldy);
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        dequant(variant, format, w + (first + r) * row_bytes, k, buf + r * k);
    for (int64_t i = 0; i < m_count; i += X_CHUNK) {
        int64_t chunk = m_count - i < X_CHUNK ? m_count - i : X_CHUNK;
        for (int64_t r = 0; r < rows; r += TILE_ROWS)
            qblock_tile(variant, buf + r * k, rows - r < TILE_ROWS ? rows - r : TILE_ROWS, x + i * k,
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
