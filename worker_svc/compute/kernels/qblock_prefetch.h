/* How the small-M tiles (qblock_q4q8.c, qblock_kquants_avx2.c, qblock_kquants_avx512.c,
 * qblock_float16.c) fetch their weights ahead.
 *
 * At M = 1 a decode step is a stream of weights from memory (the default model's are
 * ~105 MB a token, three times the L3 of a server core pair), and the tiles read it four
 * rows at a time, each at its own offset. Fetching the next tile's rows into L1 (about
 * 2.5 KB ahead, what the tiles did first) left two Zen 4 threads at 14.5 GB/s on a
 * 160 MB Q8_0 weight, where a plain sum reads 31 GB/s. Fetching 16 KB ahead in address
 * order into L2 gave 22-24 GB/s with the same arithmetic (8 KB: 20-23, 32 KB: about
 * the same as 16; into L1 at 8 KB: worse), and the default model's whole decode step
 * went from 7.1 to 5.4 ms. Rows are stored one after another, so 16 KB ahead is the
 * same offset a few dozen rows on, in the thread's own panel or the next one. A
 * prefetch past the end of a weight never faults; it costs one line of bandwidth. */
#ifndef CBSERVE_QBLOCK_PREFETCH_H
#define CBSERVE_QBLOCK_PREFETCH_H

#include <stdint.h>

enum { QBLOCK_PREFETCH_BYTES = 16384 };

/* The line QBLOCK_PREFETCH_BYTES past p, into L2 (locality 2: prefetcht1). A macro,
 * not an inline function: GCC 12 compiled such a function (with _mm_prefetch or the
 * builtin) into some of the tiles' target("avx512...") code as no instruction at all. */
#define QBLOCK_PREFETCH_AHEAD(p) \
    __builtin_prefetch((const uint8_t *)(p) + QBLOCK_PREFETCH_BYTES, 0, 2)

#endif
