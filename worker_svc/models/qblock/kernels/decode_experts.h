/* A mixture layer's MLP in the native decode step (decode_step.c), as the Python forward's
 * ExpertMlp computes it (models/forward/experts.py), in three shared-out loops:
 * 1. the router, a row each: float32 logits (plus the router's bias), the family's rule
 *    (softmax over every expert then top-k, renormalized or not; or top-k logits then a
 *    softmax over those k), the k experts chosen as torch.topk chooses them
 *    (decode_topk.h);
 * then every thread groups the rows by expert for itself (a counting sort of T * k
 * choices costs less than a barrier): expert e's rows are positions offsets[e] ..
 * offsets[e + 1] - 1 of the step's choices, in token order;
 * 2. (chosen expert, panel of its intermediate rows) items: gate/up for that expert's
 *    rows, gathered into a contiguous block once per thread and expert, its bias and
 *    activation (SiLU, or gpt-oss's clamped SwiGLU), into the expert's rows of `act`;
 * 3. panels of the hidden size: every chosen expert's down rows of the panel in
 *    ascending expert order, its bias, times each row's weight, summed per token from
 *    zero in that order (the order the Python forward adds them in), then added to the
 *    residual (or post-normed first).
 * So a step reads each chosen expert's blocks once, however many rows chose it, and no
 * other expert's. A projection takes the VNNI kernel by its own rows (the expert's
 * count), as each expert's QBlockLinear does in the Python forward. A shared expert
 * (Qwen2-MoE) rides on the same three loops (decode_shared_expert.h). */
#ifndef CBSERVE_DECODE_EXPERTS_H
#define CBSERVE_DECODE_EXPERTS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "decode_model.h"
#include "decode_panels.h"
#include "decode_rows.h"
#include "decode_shared_expert.h"
#include "decode_topk.h"
#include "step_team.h"

/* One thread's part of a mixture layer. */
struct expert_scratch {
    struct scored *queue;    /* [experts]: torch_topk's pairs */
    float *logits;           /* [experts] */
    int32_t *counts;         /* [experts]: rows that chose each expert */
    int32_t *offsets;        /* [experts + 1]: where each expert's rows start */
    int32_t *active;         /* the chosen experts, ascending; num_active of them */
    int32_t *cursor;         /* [experts]: group_rows' next position of each expert */
    int32_t *order;          /* [T * k]: grouped position -> choice (token * k + slot) */
    int64_t num_active;
    float *gathered;         /* [T, hidden]: one expert's input rows */
    int16_t *qx;             /* [T * k, I] then [T, shared I]: act's 16-bit blocks (VNNI) */
    float *dx, *sx;          /* [T * k, I / 32] then [T, shared I / 32] */
};

static int64_t expert_thread_floats(const struct decode_model *m, int64_t T)
{
    const int64_t E = m->num_experts, choices = T * m->experts_per_token;
    const int64_t acts = choices * m->expert_intermediate + T * m->shared_intermediate;
    if (E == 0)
        return 0;
    return round16(2 * E) + round16(E) + 4 * round16(E + 1) + round16(choices) +
           round16(T * m->hidden) + round16(acts / 2) + 2 * round16(acts / 32);
}

/* The expert part sits at the end of each thread's slice of the step's scratch. */
static struct expert_scratch expert_thread_part(const struct decode_model *m,
                                                const struct scratch *s, int64_t T)
{
    const int64_t E = m->num_experts, choices = T * m->experts_per_token;
    const int64_t acts = choices * m->expert_intermediate + T * m->shared_intermediate;
    float *at = s->thread_mem + s->per_thread * (omp_get_thread_num() + 1) -
                expert_thread_floats(m, T);
    struct expert_scratch es = {0};
    es.queue = (struct scored *)at, at += round16(2 * E);
    es.logits = at, at += round16(E);
    es.counts = (int32_t *)at, at += round16(E + 1);
    es.offsets = (int32_t *)at, at += round16(E + 1);
    es.active = (int32_t *)at, at += round16(E + 1);
    es.cursor = (int32_t *)at, at += round16(E + 1);
    es.order = (int32_t *)at, at += round16(choices);
    es.gathered = at, at += round16(T * m->hidden);
    es.qx = (int16_t *)at, at += round16(acts / 2);
    es.dx = at, at += round16(acts / 32);
    es.sx = at;
    return es;
}

/* Row t's k choices and weights, by the family's rule. */
static void route_row(const struct decode_model *m, const struct moe_layer *layer,
                      const float *x, int64_t t, struct expert_scratch *es, int32_t *chosen,
                      float *weights)
{
    const int64_t E = m->num_experts, k = m->experts_per_token, H = m->hidden;
    for (int64_t e = 0; e < E; e++) {
        const float *w = layer->router + e * H;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < H; i++)
            dot += x[i] * w[i];
        es->logits[e] = layer->router_bias ? dot + layer->router_bias[e] : dot;
    }
    /* softmax(v[0 .. n)) in place, as torch's: exp(v - max), times 1 / sum. */
    float *scores = es->logits;
    int64_t n = E;
    struct scored *q = es->queue;
    if (m->router == ROUTER_TOPK_SOFTMAX) {
        torch_topk(es->logits, E, k, q);
        for (int64_t j = 0; j < k; j++)
            weights[t * k + j] = q[j].value;
        scores = weights + t * k, n = k;
    }
    float top = scores[0], sum = 0.0f;
    for (int64_t i = 1; i < n; i++)
        top = scores[i] > top ? scores[i] : top;
    for (int64_t i = 0; i < n; i++)
        sum += scores[i] = expf(scores[i] - top);
    const float inverse = 1.0f / sum;
    for (int64_t i = 0; i < n; i++)
        scores[i] *= inverse;
    if (m->router == ROUTER_SOFTMAX_TOPK) {
        torch_topk(es->logits, E, k, q);
        float chosen_sum = 0.0f;
        for (int64_t j = 0; j < k; j++)
            chosen_sum += weights[t * k + j] = q[j].value;
        if (m->normalize_topk)
            for (int64_t j = 0; j < k; j++)
                weights[t * k + j] /= chosen_sum;
    }
    for (int64_t j = 0; j < k; j++)
        chosen[t * k + j] = q[j].index;
}

/* Every thread's own grouping of the step's T * k choices by expert. */
static void group_rows(const struct decode_model *m, int64_t T, const int32_t *chosen,
                       struct expert_scratch *es)
{
    const int64_t E = m->num_experts, choices = T * m->experts_per_token;
    int32_t *cursor = es->cursor;
    memset(es->counts, 0, sizeof(int32_t) * E);
    for (int64_t c = 0; c < choices; c++)
        es->counts[chosen[c]]++;
    es->num_active = 0;
    es->offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        es->offsets[e + 1] = es->offsets[e] + es->counts[e];
        cursor[e] = es->offsets[e];
        if (es->counts[e] > 0)
            es->active[es->num_active++] = (int32_t)e;
    }
    for (int64_t c = 0; c < choices; c++)
        es->order[cursor[chosen[c]]++] = (int32_t)c;
}

/* gpt-oss: (clamp(up, -limit, limit) + 1) * (g * sigmoid(alpha * g)), g = min(gate,
 * limit), in the Python forward's order of operations. */
static void clamped_swiglu_mul(const float *gate, const float *up, float *out, int64_t n,
                               float alpha, float limit)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i] > limit ? limit : gate[i];
        const float u = up[i] > limit ? limit : up[i] < -limit ? -limit : up[i];
        out[i] = (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
    }
}

/* Item (a, p) of loop 2: chosen expert active[a], panel p of its intermediate rows. */
static void expert_gate_up(const struct decode_model *m, const struct moe_layer *layer,
                           int variant, int64_t item, const float *normed, float *act,
                           const struct thread_scratch *ts, struct expert_scratch *es,
                           int64_t *gathered)
{
    const int64_t H = m->hidden, I = m->expert_intermediate, k = m->experts_per_token;
    const int64_t e = es->active[item / panels_of(I)], p = item % panels_of(I);
    const int64_t count = es->counts[e], offset = es->offsets[e];
    const struct block_weight *w = &layer->gate_up[e];
    struct thread_scratch view = rows_view(ts, count);
    if (*gathered != e) {
        for (int64_t j = 0; j < count; j++)
            memcpy(es->gathered + j * H, normed + (es->order[offset + j] / k) * H,
                   sizeof(float) * H);
        prepare_input(&view, w, es->gathered, count, H);
        *gathered = e;
    }
    const int64_t first = p * QBLOCK_PANEL_ROWS, rows = panel_rows(I, p);
    project_rows(variant, w, first, rows, es->gathered, count, H, view.out_a, QBLOCK_PANEL_ROWS,
                 &view);
    project_rows(variant, w, I + first, rows, es->gathered, count, H, view.out_b,
                 QBLOCK_PANEL_ROWS, &view);
    const float *bias = layer->gate_up_bias ? (const float *)layer->gate_up_bias[e] : NULL;
    for (int64_t j = 0; j < count; j++) {
        float *gate = view.out_a + j * QBLOCK_PANEL_ROWS, *up = view.out_b + j * QBLOCK_PANEL_ROWS;
        if (bias)
            for (int64_t r = 0; r < rows; r++)
                gate[r] += bias[first + r], up[r] += bias[I + first + r];
        float *out = act + (offset + j) * I + first;
        if (m->expert_activation == ACTIVATION_SWIGLU_CLAMPED)
            clamped_swiglu_mul(gate, up, out, rows, (float)m->swiglu_alpha,
                               (float)m->swiglu_limit);
        else
            llama_silu_mul(gate, up, out, rows);
    }
}

/* Before a thread's first item of loop 3: act's rows as 16-bit blocks for each expert
 * whose down projection reads them (VNNI from its count, or the small tiles). */
static void prepare_act(const struct decode_model *m, const struct moe_layer *layer,
                        const float *act, const struct thread_scratch *ts,
                        struct expert_scratch *es)
{
    const int64_t I = m->expert_intermediate;
    for (int64_t a = 0; a < es->num_active; a++) {
        const int64_t e = es->active[a], count = es->counts[e], offset = es->offsets[e];
        struct thread_scratch view = rows_view(ts, count);
        if (view.vnni || (small_vnni_rows(&view, count) && has_small_vnni_run(&layer->down[e])))
            qblock_vnni_quantize_rows(act + offset * I, count, I, es->qx + offset * I,
                                      es->dx + offset * I / 32, es->sx + offset * I / 32);
    }
}

/* Panel p of loop 3: out[t, panel] = sum over t's experts, ascending, of weight *
 * (down(act) + bias); added to hidden, or written to `projected` for a post-norm. */
static void expert_down(const struct decode_model *m, const struct moe_layer *layer,
                        int variant, int64_t p, int64_t T, const float *act,
                        const float *weights, float *hidden, float *projected,
                        const struct thread_scratch *ts, struct expert_scratch *es,
                        const float *shared_act, const struct thread_scratch *shared_view)
{
    const int64_t H = m->hidden, I = m->expert_intermediate, k = m->experts_per_token;
    const int64_t first = p * QBLOCK_PANEL_ROWS, rows = panel_rows(H, p);
    float *sum = ts->out_b; /* [T, QBLOCK_PANEL_ROWS] */
    memset(sum, 0, sizeof(float) * T * QBLOCK_PANEL_ROWS);
    for (int64_t a = 0; a < es->num_active; a++) {
        const int64_t e = es->active[a], count = es->counts[e], offset = es->offsets[e];
        struct thread_scratch view = rows_view(ts, count);
        view.qx = es->qx + offset * I, view.dx = es->dx + offset * I / 32;
        view.sx = es->sx + offset * I / 32;
        project_rows(variant, &layer->down[e], first, rows, act + offset * I, count, I,
                     view.out_a, QBLOCK_PANEL_ROWS, &view);
        const float *bias = layer->down_bias ? (const float *)layer->down_bias[e] : NULL;
        for (int64_t j = 0; j < count; j++) {
            const int64_t choice = es->order[offset + j];
            const float weight = weights[choice];
            const float *y = view.out_a + j * QBLOCK_PANEL_ROWS;
            float *into = sum + (choice / k) * QBLOCK_PANEL_ROWS;
            for (int64_t r = 0; r < rows; r++)
                into[r] += (bias ? y[r] + bias[first + r] : y[r]) * weight;
        }
    }
    if (shared_act)
        add_shared_down(m, layer, variant, p, T, shared_act, sum, shared_view);
    for (int64_t t = 0; t < T; t++) {
        const float *from = sum + t * QBLOCK_PANEL_ROWS;
        if (projected)
            memcpy(projected + t * H + first, from, sizeof(float) * rows);
        else
            for (int64_t r = 0; r < rows; r++)
                hidden[t * H + first + r] += from[r];
    }
}

/* A mixture layer's MLP, after the post-attention norm (every thread's ts->normed). */
static void run_experts(const struct decode_model *m, const struct moe_layer *layer,
                        int variant, int64_t T, const float *post_norm, const struct scratch *s,
                        const struct thread_scratch *ts, struct member *me)
{
    const int64_t H = m->hidden, I = m->expert_intermediate, k = m->experts_per_token;
    struct expert_scratch es = expert_thread_part(m, s, T);
    float *shared_act = has_shared_expert(m, layer) ? shared_act_of(m, s, T) : NULL;
    float *gates = shared_act ? shared_gates_of(m, shared_act, T) : NULL;
    FOR_SHARED(t, T, me, 1)
    {
        route_row(m, layer, ts->normed + t * H, t, &es, s->chosen, s->route_weights);
        if (gates)
            shared_gate_row(m, layer, ts->normed + t * H, gates + t);
    }
    share_end(me);
    group_rows(m, T, s->chosen, &es);
    int64_t gathered = -1;
    const int64_t routed = es.num_active * panels_of(I);
    FOR_SHARED(item, routed + (shared_act ? panels_of(m->shared_intermediate) : 0), me,
               me->dynamic)
    {
        if (item < routed)
            expert_gate_up(m, layer, variant, item, ts->normed, s->expert_act, ts, &es,
                           &gathered);
        else
            shared_gate_up(m, layer, variant, item - routed, T, ts->normed, shared_act, ts,
                           &gathered);
    }
    share_end(me);
    int prepared = 0;
    struct thread_scratch shared_view = *ts;
    FOR_SHARED(p, panels_of(H), me, me->dynamic)
    {
        if (!prepared) {
            prepare_act(m, layer, s->expert_act, ts, &es), prepared = 1;
            if (shared_act)
                shared_view = shared_down_view(layer, T, m->shared_intermediate, shared_act,
                                               ts, es.qx + T * k * I, es.dx + T * k * I / 32,
                                               es.sx + T * k * I / 32);
        }
        expert_down(m, layer, variant, p, T, s->expert_act, s->route_weights, s->hidden,
                    post_norm ? s->projected : NULL, ts, &es, shared_act, &shared_view);
    }
    share_end(me);
    if (post_norm == NULL)
        return;
    FOR_SHARED(t, T, me, 1)
    {
        rms_norm(s->projected + t * H, post_norm, H, (float)m->eps, ts->normed);
        add_row(s->hidden + t * H, ts->normed, H);
    }
    share_end(me);
}

#endif
