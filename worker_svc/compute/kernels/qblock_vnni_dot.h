/* The VNNI panels' product step (qblock_vnni.c, qblock_kquants_vnni.c), shared. */
#ifndef CBSERVE_QBLOCK_VNNI_DOT_H
#define CBSERVE_QBLOCK_VNNI_DOT_H

#include <stdint.h>

/* acc += wv . (the int16 pair at `pair`, broadcast to every lane): vpdpwssd with the pair
 * as an embedded broadcast. Written in asm because GCC 12 compiles the intrinsic
 * (_mm512_dpwssd_epi32 with _mm512_set1_epi32) into a separate vpbroadcastd and up to
 * two register copies around every product of panel_rows' loop; with this and the loop
 * unrolled, the loop is one load and MM products per pair of k. Measured on a Zen 4 VM
 * (Q4_1 [3072, 576] at M = 64, best of 600 calls, builds alternated five times):
 * 0.759 ms against 0.799 ms, inside that machine's noise; the copies were likely
 * renamed away. Kept for the shorter loop, not for a measured gain. */
#define DPWSSD_BROADCAST(acc, wv, pair) \
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(wv), "m"(*(const int32_t *)(pair)))

#endif
