/* The dispatch of a small tile (rows <= 4 weight rows times m_count <= 8 rows of x) to
 * a kernel `SMALL(w, row_bytes, x, k, y, ldy, FORMAT, RR, MM)` whose RR and MM are
 * constants, so that each case compiles to its own register blocking: four weight rows
 * with 1-4 rows of x, two with 5-8 (RR * MM <= 16 accumulators of the 32 AVX-512
 * registers), so that a decode of up to 8 rows (a few sequences, or one with its drafts)
 * unpacks each block once; a partial tile row by row. Shared by the Q4_1 / Q8_0 tile
 * (qblock_q4q8.c) and the K-quants' (qblock_kquants_avx512.c); expects w, row_bytes,
 * rows, x, m_count, k, y and ldy in scope. */
#ifndef CBSERVE_QBLOCK_SMALL_CASES_H
#define CBSERVE_QBLOCK_SMALL_CASES_H

#define QBLOCK_SMALL_CASES(SMALL, FORMAT)                                                     \
    if (rows == 4) {                                                                          \
        switch (m_count) {                                                                    \
        case 1: SMALL(w, row_bytes, x, k, y, ldy, FORMAT, 4, 1); break;                       \
        case 2: SMALL(w, row_bytes, x, k, y, ldy, FORMAT, 4, 2); break;                       \
        case 3: SMALL(w, row_bytes, x, k, y, ldy, FORMAT, 4, 3); break;                       \
        case 4: SMALL(w, row_bytes, x, k, y, ldy, FORMAT, 4, 4); break;                       \
        default:                                                                              \
            for (int64_t r = 0; r < 4; r += 2) {                                              \
                const uint8_t *w2 = w + r * row_bytes;                                        \
                switch (m_count) {                                                            \
                case 5: SMALL(w2, row_bytes, x, k, y + r, ldy, FORMAT, 2, 5); break;          \
                case 6: SMALL(w2, row_bytes, x, k, y + r, ldy, FORMAT, 2, 6); break;          \
                case 7: SMALL(w2, row_bytes, x, k, y + r, ldy, FORMAT, 2, 7); break;          \
                default: SMALL(w2, row_bytes, x, k, y + r, ldy, FORMAT, 2, 8); break;         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    } else {                                                                                  \
        for (int64_t r = 0; r < rows; r++)                                                    \
            for (int64_t i = 0; i < m_count; i++)                                             \
                SMALL(w + r * row_bytes, row_bytes, x + i * k, k, y + i * ldy + r, ldy,       \
                      FORMAT, 1, 1);                                                          \
    }

#endif
