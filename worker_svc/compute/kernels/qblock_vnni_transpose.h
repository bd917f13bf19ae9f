/* A VNNI panel's transpose, shared by both packers (qblock_vnni.c for Q4_1 / Q8_0,
 * qblock_kquants_vnni.c for the K-quants and Q5_0) as an inline function, so that
 * neither object calls into the other for it.
 *
 * tmp[16][k] int16 (a panel's rows, k a multiple of 32) -> wq[k / 2][16][2]: vector k2
 * holds every row's int16 pair at 2 * k2 (lane r: row r), the layout the panel's
 * vpdpwssd reads. 16 x 16 32-bit words at a time, in registers (64 shuffles a tile). A
 * gather a vector did the same before (16 loads each): the packing is paid every call,
 * and on Zen 4 the kernel ran 18-20% faster at M = 64 and 25-59% at M = 16 without the
 * gathers (python -m bench.micro.qblock --variants vnni). The packed panel is the same.
 */
#ifndef CBSERVE_QBLOCK_VNNI_TRANSPOSE_H
#define CBSERVE_QBLOCK_VNNI_TRANSPOSE_H

#include <stdint.h>

#include <immintrin.h>

__attribute__((target("avx512f"))) static inline void vnni_transpose_panel(const int16_t *tmp,
                                                                          int64_t k, int16_t *wq)
{
    enum { lanes = 16 }; /* a panel's rows */
    const int64_t words = k / 2; /* a row's int16 pairs */
    for (int64_t c0 = 0; c0 < words; c0 += lanes) {
        __m512i a[lanes], t[lanes], u[lanes];
        for (int r = 0; r < lanes; r++)
            a[r] = _mm512_loadu_si512(tmp + r * k + 2 * c0);
        /* Per 128-bit lane L (columns 4L .. 4L + 3): pairs of rows, then quads of rows. */
        for (int r = 0; r < lanes; r += 2) {
            t[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);
            t[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]);
        }
        for (int g = 0; g < lanes; g += 4) { /* u[g + j]: rows g .. g + 3 at column 4L + j */
            u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
            u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
            u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
            u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
        }
        /* Column 4L + j: lane L of u[j], u[4 + j], u[8 + j], u[12 + j], in that order. */
        for (int j = 0; j < 4; j++) {
            const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
            const __m512i x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
            const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
            const __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
            int16_t *out = wq + (c0 + j) * 32;
            _mm512_storeu_si512(out + 0 * 4 * 32, _mm512_shuffle_i32x4(x0, y0, 0x88));
            _mm512_storeu_si512(out + 1 * 4 * 32, _mm512_shuffle_i32x4(x0, y0, 0xdd));
            _mm512_storeu_si512(out + 2 * 4 * 32, _mm512_shuffle_i32x4(x1, y1, 0x88));
            _mm512_storeu_si512(out + 3 * 4 * 32, _mm512_shuffle_i32x4(x1, y1, 0xdd));
        }
    }
}

#endif
