/* The VNNI panels' product step (qblock_vnni.c, qblock_kquants_vnni.c), shared. */
#ifndef CBSERVE_QBLOCK_VNNI_DOT_H
#define CBSERVE_QBLOCK_VNNI_DOT_H

#include <stdint.h>

/* acc += wv . (the int16 pair at `pair`, broadcast to every lane): vpdpwssd with the pair
 * as an embedded broadcast. Written in asm because GCC 12 compiles the intrinsic
 * (_mm512_dpwssd_epi32 with _mm512_set1_epi32) into a separate vpbroadcastd and up to
 * two register copies around every product of panel_rows' loop (perf annotate: the
 * copies and broadcasts held most of the loop's samples). With this and the loop
 * unrolled, the loop is one load and MM products per pair of k; the default model's
 * 64-row projections went from a median of 250 to 275 GFLOP/s on a Zen 4 (`cbserve
 * bench roofline --rows 64`, alternating builds, a noisy VM). */
#define DPWSSD_BROADCAST(acc, wv, pair) \
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wv), "m"(*(const int32_t *)(pair)))

#endif
