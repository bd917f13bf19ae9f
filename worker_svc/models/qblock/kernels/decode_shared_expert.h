/* A mixture layer's shared expert in the native decode step (Qwen2-MoE; decode_experts.h
 * runs it), as the Python forward's ExpertMlp computes it (models/forward/experts.py):
 * a dense SwiGLU MLP of its own intermediate width that every row runs, scaled per row
 * by sigmoid(w . x) (w the float32 [hidden] row of its gate, kept float as the router
 * is) and added to the routed experts' sum last, before that sum meets the residual:
 * out + sigmoid(g) * shared, the Python forward's two roundings.
 * It rides on the mixture's three loops, so it costs no barrier of its own:
 * 1. beside each row's routing, its gate;
 * 2. after the chosen experts' (expert, panel) items, one item per panel of its
 *    intermediate rows: gate/up and SiLU-mul over all T rows (swiglu_panel, the dense
 *    MLP's), into its act [T, shared I];
 * 3. in each panel of the hidden size, after the routed experts: its down rows of the
 *    panel over all T rows, times each row's gate, added to the row's sum.
 * Its act and gates sit after the chosen experts' act in the team's scratch; its act's
 * 16-bit blocks (where VNNI reads them) after theirs in each thread's. */
#ifndef CBSERVE_DECODE_SHARED_EXPERT_H
#define CBSERVE_DECODE_SHARED_EXPERT_H

#include <math.h>
#include <stdint.h>

#include "decode_model.h"
#include "decode_panels.h"

/* The thread's scratch for a projection of `rows` rows: the VNNI kernel from
 * vnni_from_m rows, as QBlockLinear decides by its own M (each expert's, the shared one's). */
static struct thread_scratch rows_view(const struct thread_scratch *ts, int64_t rows)
{
    struct thread_scratch view = *ts;
    view.vnni = ts->vnni_from_m > 0 && rows >= ts->vnni_from_m;
    return view;
}

static int has_shared_expert(const struct decode_model *m, const struct moe_layer *layer)
{
    return m->shared_intermediate > 0 && layer->shared_gate_up != NULL;
}

/* Floats of the team's scratch after the chosen experts' act: act [T, shared I], gates [T]. */
static int64_t shared_team_floats(const struct decode_model *m, int64_t T)
{
    return m->shared_intermediate > 0 ? round16(T * m->shared_intermediate) + round16(T) : 0;
}

static float *shared_act_of(const struct decode_model *m, const struct scratch *s, int64_t T)
{
    return s->expert_act + T * m->experts_per_token * m->expert_intermediate;
}

static float *shared_gates_of(const struct decode_model *m, float *act, int64_t T)
{
    return act + round16(T * m->shared_intermediate);
}

/* Loop 1, one row: sigmoid(w . x) as torch.sigmoid computes it; 1 where ungated (a
 * product by 1 is exact, so the ungated sum is out + shared). */
static void shared_gate_row(const struct decode_model *m, const struct moe_layer *layer,
                            const float *x, float *gate)
{
    if (layer->shared_gate == NULL) {
        *gate = 1.0f;
        return;
    }
    const float *w = layer->shared_gate;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < m->hidden; i++)
        dot += x[i] * w[i];
    *gate = 1.0f / (1.0f + expf(-dot));
}

/* Loop 2, shared item p: gate/up and SiLU-mul of the panel over every row; the thread's
 * qx holds the normed rows' blocks where VNNI reads (`gathered` E: no expert's rows). */
static void shared_gate_up(const struct decode_model *m, const struct moe_layer *layer,
                           int variant, int64_t p, int64_t T, const float *normed, float *act,
                           const struct thread_scratch *ts, int64_t *gathered)
{
    struct thread_scratch view = rows_view(ts, T);
    if (*gathered != m->num_experts) {
        prepare_input(&view, layer->shared_gate_up, normed, T, m->hidden);
        *gathered = m->num_experts;
    }
    swiglu_panel(variant, layer->shared_gate_up, p, m->shared_intermediate, normed, T, m->hidden,
                 act, ACTIVATION_SILU, NULL, &view);
}

/* Before the thread's first item of loop 3: its view for the shared down over all T
 * rows, act's blocks (where VNNI reads them) written to qx, dx and sx. */
static struct thread_scratch shared_down_view(const struct moe_layer *layer, int64_t T,
                                              int64_t SI, const float *act,
                                              const struct thread_scratch *ts, int16_t *qx,
                                              float *dx, float *sx)
{
    struct thread_scratch view = rows_view(ts, T);
    view.qx = qx, view.dx = dx, view.sx = sx;
    if (view.vnni || (small_vnni_rows(&view, T) && has_small_vnni_run(layer->shared_down)))
        qblock_vnni_quantize_rows(act, T, SI, qx, dx, sx);
    return view;
}

/* Loop 3, panel p: sum[t, panel] += gate[t] * (act @ down^T)[t, panel] for every row;
 * `view` decides the kernel by T rows, its qx holding act's blocks where VNNI reads. */
static void add_shared_down(const struct decode_model *m, const struct moe_layer *layer,
                            int variant, int64_t p, int64_t T, const float *act, float *sum,
                            const struct thread_scratch *view)
{
    const int64_t SI = m->shared_intermediate, H = m->hidden;
    const int64_t first = p * QBLOCK_PANEL_ROWS, rows = panel_rows(H, p);
    const float *gates = act + round16(T * SI);
    project_rows(variant, layer->shared_down, first, rows, act, T, SI, view->out_a,
                 QBLOCK_PANEL_ROWS, view);
    for (int64_t t = 0; t < T; t++) {
        const float *y = view->out_a + t * QBLOCK_PANEL_ROWS;
        float *into = sum + t * QBLOCK_PANEL_ROWS;
        for (int64_t r = 0; r < rows; r++)
            into[r] += gates[t] * y[r];
    }
}

#endif
