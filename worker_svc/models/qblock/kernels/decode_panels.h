/* The native decode step's projections (decode_step.c): a thread's scratch, and its
 * share of a projection, one panel of QBLOCK_PANEL_ROWS output rows at a time, by the
 * block kernel (float activations), the VNNI kernel (16-bit activation blocks; 8-bit for
 * a weight with act8, qblock_vnni8.c) or, for
 * BF16 rows, the bf16 panels (bfloat16 activations, qblock_bf16_panel.c), with
 * the residual add or SwiGLU applied to the panel while it is in cache, and the adapter
 * rows' LoRA delta (decode_lora.h) added to the panel before either. */
#ifndef CBSERVE_DECODE_PANELS_H
#define CBSERVE_DECODE_PANELS_H

#include <omp.h>
#include <stdint.h>

#include "../../../compute/kernels/qblock_bf16_panel.h"
#include "../../../compute/kernels/qblock_gemm.h"
#include "../../../compute/kernels/qblock_kquants.h"
#include "../../../compute/kernels/qblock_vnni.h"
#include "../../../compute/kernels/qblock_vnni8.h"
#include "decode_lora.h"
#include "decode_model.h"
#include "decode_rows.h"

void llama_silu_mul(const float *gate, const float *up, float *out, int64_t n);
void gelu_tanh_mul(const float *gate, const float *up, float *out, int64_t n);

enum { ACTIVATION_SILU = 0, ACTIVATION_GELU_TANH = 1, ACTIVATION_SWIGLU_CLAMPED = 2 };

static int64_t panels_of(int64_t n)
{
    return (n + QBLOCK_PANEL_ROWS - 1) / QBLOCK_PANEL_ROWS;
}

static int64_t panel_rows(int64_t n, int64_t panel)
{
    int64_t left = n - panel * QBLOCK_PANEL_ROWS;
    return left < QBLOCK_PANEL_ROWS ? left : QBLOCK_PANEL_ROWS;
}

/* Scratch of the whole team, and of each thread. */
struct scratch {
    float *hidden, *qkv, *attended, *act;
    float *projected; /* [T, hidden]: o_proj's or down's output before a post-norm */
    int32_t *chosen;      /* [T, k]: a mixture layer's experts of each row */
    float *route_weights; /* [T, k]: and their weights */
    float *expert_act;    /* [T * k, expert I]: the chosen experts' act(gate) * up */
    float *thread_mem;
    int64_t per_thread;
};

struct thread_scratch {
    float *panel;         /* the block kernel's buffer, QBLOCK_PANEL_ROWS * max K */
    int16_t *vnni_tmp;    /* the VNNI kernel's packed panel, 2 * 16 * max K int16 */
    float *vnni_scales;   /* and its scales, 2 * 16 * max K / 32 */
    int16_t *qx;          /* [T, max K]: this thread's activation blocks (VNNI; int8 for
                           * a weight with act8) */
    float *dx, *sx;       /* [T, max K / 32] each */
    uint16_t *xb;         /* [T, max K]: the input in bfloat16 (bf16 panels) */
    float *normed;        /* [T, hidden]: this thread's copy of the normed rows */
    float *out_a, *out_b; /* [T, QBLOCK_PANEL_ROWS] each: a panel's outputs */
    float *scores;        /* group * longest context */
    int vnni;             /* this step's projections take the VNNI kernel */
    int small_vnni;       /* below vnni_from_m: Q5_0, Q4_K, Q6_K take small VNNI tiles */
    int64_t vnni_from_m;  /* rows from which a projection takes the VNNI kernel; 0: never */
    int bf16;             /* this step's BF16 rows take the bf16 panels (bf16_panel_rows) */
};

/* Floats of one thread's scratch; each part a multiple of 16 floats (64 bytes). */
static int64_t round16(int64_t floats)
{
    return (floats + 15) / 16 * 16;
}

static int64_t thread_floats(int64_t tokens, int64_t hidden, int64_t max_k, int64_t scores)
{
    return round16(QBLOCK_PANEL_ROWS * max_k) + round16(QBLOCK_VNNI_PANEL_ROWS * max_k) +
           round16(QBLOCK_VNNI_PANEL_ROWS * max_k / 16) + 2 * round16(tokens * max_k / 2) +
           2 * round16(tokens * max_k / 32) + round16(tokens * hidden) +
           2 * round16(tokens * QBLOCK_PANEL_ROWS) + round16(scores);
}

static struct thread_scratch thread_part(const struct scratch *s, int64_t tokens, int64_t hidden,
                                         int64_t max_k, int vnni, int small_vnni)
{
    float *at = s->thread_mem + s->per_thread * omp_get_thread_num();
    struct thread_scratch out;
    out.panel = at, at += round16(QBLOCK_PANEL_ROWS * max_k);
    out.vnni_tmp = (int16_t *)at, at += round16(QBLOCK_VNNI_PANEL_ROWS * max_k);
    out.vnni_scales = at, at += round16(QBLOCK_VNNI_PANEL_ROWS * max_k / 16);
    out.qx = (int16_t *)at, at += round16(tokens * max_k / 2);
    out.dx = at, at += round16(tokens * max_k / 32);
    out.sx = at, at += round16(tokens * max_k / 32);
    out.xb = (uint16_t *)at, at += round16(tokens * max_k / 2);
    out.normed = at, at += round16(tokens * hidden);
    out.out_a = at, at += round16(tokens * QBLOCK_PANEL_ROWS);
    out.out_b = at, at += round16(tokens * QBLOCK_PANEL_ROWS);
    out.scores = at;
    out.vnni = vnni;
    out.small_vnni = small_vnni;
    out.bf16 = 0;
    return out;
}

/* Whether BF16 rows take the bf16 panels at m rows: from the batch's bf16_from_m (the
 * Python side's measured threshold, models/qblock/native.py), where the CPU has them. */
static int bf16_panel_rows(const struct decode_batch *b, int64_t m)
{
    return b->bf16_from_m > 0 && m >= b->bf16_from_m && qblock_bf16_supported();
}

/* Whether Q5_0's, Q4_K's and Q6_K's rows take the VNNI kernel's small tiles (16-bit activation
 * blocks) at this m: where the CPU has VNNI and m is below vnni_from_m, up to
 * KQ_SMALL_VNNI_M. */
static int small_vnni_rows(const struct thread_scratch *ts, int64_t m)
{
    return !ts->vnni && ts->small_vnni && m <= KQ_SMALL_VNNI_M;
}

static int has_small_vnni_run(const struct block_weight *w)
{
    for (int64_t run = 0; run < w->runs; run++)
        if (kq_small_vnni_reads((int)w->format[run]))
            return 1;
    return 0;
}

static int has_bf16_run(const struct block_weight *w)
{
    for (int64_t run = 0; run < w->runs; run++)
        if (w->format[run] == QBLOCK_FORMAT_BF16)
            return 1;
    return 0;
}

/* Before a projection's panels: its input's activation blocks, where a VNNI kernel
 * reads some of the weight's rows (8-bit ones for a weight with act8), and its bfloat16
 * copy where the bf16 panels do. */
static void prepare_input(const struct thread_scratch *ts, const struct block_weight *w,
                          const float *x, int64_t m, int64_t k)
{
    if (ts->vnni && w->act8)
        qblock_vnni8_quantize_rows(x, m, k, (int8_t *)ts->qx, ts->dx, ts->sx);
    else if (ts->vnni || (small_vnni_rows(ts, m) && has_small_vnni_run(w)))
        qblock_vnni_quantize_rows(x, m, k, ts->qx, ts->dx, ts->sx);
    if (ts->bf16 && has_bf16_run(w))
        qblock_bf16_convert_rows(x, m, k, ts->xb);
}

/* Output rows first .. first + rows - 1 (rows <= QBLOCK_PANEL_ROWS) of y = x @ W^T, by
 * the kernel this step uses; with VNNI, x is what prepare_input was given. The VNNI
 * kernel reads Q4_1, Q8_0, the K-quants, Q5_0 and MXFP4 (BlockFormat.vnni, QBlockLinear's rule
 * too): a file's other formats have their panels on the float block kernel in the same
 * step. */
static void project(int variant, int format, const uint8_t *w, int64_t first, int64_t rows,
                    const float *x, int64_t m, int64_t k, float *y, int64_t ldy,
                    const struct thread_scratch *ts, int act8)
{
    if (act8 && ts->vnni && format == QBLOCK_FORMAT_Q4_1) { /* prepare_input's int8 blocks */
        for (int64_t r = 0; r < rows; r += QBLOCK_VNNI_PANEL_ROWS)
            qblock_vnni8_panel(w, first + r,
                               rows - r < QBLOCK_VNNI_PANEL_ROWS ? rows - r : QBLOCK_VNNI_PANEL_ROWS,
                               k, (const int8_t *)ts->qx, ts->dx, ts->sx, m, y, ldy,
                               (uint8_t *)ts->vnni_tmp, ts->vnni_scales);
        return;
    }
    const int vnni_reads = (format >= QBLOCK_FORMAT_Q4_1 && format <= QBLOCK_FORMAT_Q5_0) ||
                           format == QBLOCK_FORMAT_MXFP4;
    const int small = kq_small_vnni_reads(format) && small_vnni_rows(ts, m);
    if (ts->bf16 && format == QBLOCK_FORMAT_BF16) { /* x's bfloat16 copy is ts->xb */
        for (int64_t r = 0; r < rows; r += QBLOCK_BF16_PANEL_ROWS)
            qblock_bf16_panel(w, first + r,
                              rows - r < QBLOCK_BF16_PANEL_ROWS ? rows - r : QBLOCK_BF16_PANEL_ROWS,
                              k, ts->xb, m, y, ldy, 1, (uint16_t *)ts->vnni_tmp);
        return;
    }
    if (!small && (!ts->vnni || !vnni_reads)) {
        qblock_panel(variant, format, w, first, rows, x, m, k, y, ldy, ts->panel);
        return;
    }
    for (int64_t r = 0; r < rows; r += QBLOCK_VNNI_PANEL_ROWS)
        qblock_vnni_panel(format, w, first + r,
                          rows - r < QBLOCK_VNNI_PANEL_ROWS ? rows - r : QBLOCK_VNNI_PANEL_ROWS,
                          k, ts->qx, ts->dx, ts->sx, m, y, ldy, ts->vnni_tmp, ts->vnni_scales);
}

/* y[i * ldy + r] = x[i] . W[lo + r] for r < n: rows lo .. lo + n - 1 of a weight, each
 * run's rows by its own format (a range may cross from one run into the next). */
static void project_rows(int variant, const struct block_weight *w, int64_t lo, int64_t n,
                         const float *x, int64_t m, int64_t k, float *y, int64_t ldy,
                         const struct thread_scratch *ts)
{
    int64_t start = 0;
    for (int64_t run = 0; run < w->runs; start = w->run_end[run], run++) {
        const int64_t from = lo > start ? lo : start;
        const int64_t to = lo + n < w->run_end[run] ? lo + n : w->run_end[run];
        if (from >= to)
            continue;
        const int format = (int)w->format[run];
        project(variant, format, w->blocks[run] + (from - start) * qblock_row_bytes(format, k), 0,
                to - from, x, m, k, y + (from - lo), ldy, ts, (int)w->act8);
    }
}

/* hidden[:, panel rows] += (x @ W^T + bias + delta)[:, panel rows]: a thread's share of
 * a projection whose output is added to the residual stream. The bias (float [n], NULL:
 * none; gpt-oss's o_proj) is added to the product first, as QBlockLinear adds it, then
 * the adapter rows' delta (NULL: none; decode_lora.h), as the Python path adds it. */
static void residual_panel(int variant, const struct block_weight *w, int64_t panel, int64_t n,
                           const float *x, int64_t tokens, int64_t k, const float *bias,
                           const struct lora_delta *delta, float *hidden,
                           const struct thread_scratch *ts)
{
    int64_t first = panel * QBLOCK_PANEL_ROWS, rows = panel_rows(n, panel);
    lora_prefetch_rows(delta, first, rows);
    project_rows(variant, w, first, rows, x, tokens, k, ts->out_a, QBLOCK_PANEL_ROWS, ts);
    if (delta) {
        for (int64_t i = 0; bias && i < tokens; i++)
            add_row(ts->out_a + i * QBLOCK_PANEL_ROWS, bias + first, rows);
        lora_expand_rows(delta, first, rows, ts->out_a, QBLOCK_PANEL_ROWS);
        bias = NULL;
    }
    for (int64_t i = 0; i < tokens; i++) {
        float *out = ts->out_a + i * QBLOCK_PANEL_ROWS;
        if (bias)
            add_row(out, bias + first, rows);
        add_row(hidden + i * n + first, out, rows);
    }
}

/* act[:, panel rows] = act(gate) * up for the panel's rows of both halves of gate_up,
 * the adapter rows' delta (NULL: none) added to both before the activation. */
static void swiglu_panel(int variant, const struct block_weight *w, int64_t panel,
                         int64_t intermediate, const float *x, int64_t tokens, int64_t k,
                         float *act, int activation, const struct lora_delta *delta,
                         const struct thread_scratch *ts)
{
    int64_t first = panel * QBLOCK_PANEL_ROWS, rows = panel_rows(intermediate, panel);
    lora_prefetch_rows(delta, first, rows);
    lora_prefetch_rows(delta, intermediate + first, rows);
    project_rows(variant, w, first, rows, x, tokens, k, ts->out_a, QBLOCK_PANEL_ROWS, ts);
    project_rows(variant, w, intermediate + first, rows, x, tokens, k, ts->out_b,
                 QBLOCK_PANEL_ROWS, ts);
    lora_expand_rows(delta, first, rows, ts->out_a, QBLOCK_PANEL_ROWS);
    lora_expand_rows(delta, intermediate + first, rows, ts->out_b, QBLOCK_PANEL_ROWS);
    void (*gated)(const float *, const float *, float *, int64_t) =
        activation == ACTIVATION_GELU_TANH ? gelu_tanh_mul : llama_silu_mul;
    for (int64_t i = 0; i < tokens; i++)
        gated(ts->out_a + i * QBLOCK_PANEL_ROWS, ts->out_b + i * QBLOCK_PANEL_ROWS,
              act + i * intermediate + first, rows);
}

/* hidden += post_norm(x @ W^T + bias) (Gemma's sandwich), or hidden += x @ W^T + bias
 * where the layer has no post-norm: then each panel adds its own columns, with no second
 * loop. The bias (float [hidden], NULL: none) is gpt-oss's o_proj's, added before the
 * post-norm as the Python forward's projection adds it; so is the adapter rows' delta
 * (NULL: none; its shrink already done). */
static void add_projection(const struct decode_model *m, int variant,
                           const struct block_weight *w, const float *x, int64_t T, int64_t k,
                           const float *bias, const struct lora_delta *delta,
                           const float *post_norm, const struct scratch *s,
                           const struct thread_scratch *ts, struct member *me)
{
    const int64_t H = m->hidden;
    if (post_norm == NULL) {
        FOR_SHARED(p, panels_of(H), me, me->dynamic)
        residual_panel(variant, w, p, H, x, T, k, bias, delta, s->hidden, ts);
        share_end(me);
        return;
    }
    FOR_SHARED(p, panels_of(H), me, me->dynamic)
    {
        float *y = s->projected + p * QBLOCK_PANEL_ROWS;
        lora_prefetch_rows(delta, p * QBLOCK_PANEL_ROWS, panel_rows(H, p));
        project_rows(variant, w, p * QBLOCK_PANEL_ROWS, panel_rows(H, p), x, T, k, y, H, ts);
        lora_expand_rows(delta, p * QBLOCK_PANEL_ROWS, panel_rows(H, p), y, H);
    }
    share_end(me);
    FOR_SHARED(t, T, me, 1)
    {
        if (bias)
            add_row(s->projected + t * H, bias, H);
        rms_norm(s->projected + t * H, post_norm, H, (float)m->eps, ts->normed);
        add_row(s->hidden + t * H, ts->normed, H);
    }
    share_end(me);
}

#endif
