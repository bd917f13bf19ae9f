/* A whole decode step of the own forward (worker_svc/models/forward/decoder.py) on GGUF
 * blocks, in one call and one OpenMP parallel region: for every layer RMSNorm, the fused
 * QKV projection, rotary, K/V written into the paged pool, paged decode attention (GQA),
 * o_proj and its residual, RMSNorm, gate/up, act(gate) * up, down and its residual; then
 * the final norm and the LM head for the rows that sample. Python hands over the step's
 * tensors and the weights' addresses (models/qblock/native.py) and samples from the
 * float32 logits.
 *
 * Every token is a decode: token t is the last of sequence t, whose K/V so far lie in
 * the pool's blocks block_tables[t] and whose context (this token included) is
 * context_lens[t] long. Its K/V go to pool slot slot_mapping[t], as the Python backends
 * write them, so a later step or prefill reads them unchanged. A float16 pool
 * (--kv-cache-dtype float16) gets them rounded to nearest even, as torch's .half() rounds
 * them on the Python path, and is read by the paged-decode kernel's float16 loop.
 *
 * The projections are the block kernel's own panels (compute/kernels/qblock_gemm.c) and
 * the attention is the paged-decode kernel's own loop (attention/kernels/paged_decode.c):
 * both objects are linked into this library, so the step computes what the Python path
 * computes, but for the last bit of the norms' sums (another order) and of the MLP's
 * activation (vectorised expf/tanhf, llama_activation.c). Built with -ffp-contract=off,
 * as the block kernel is: rotary is x1 * cos - x2 * sin with two roundings, as in torch.
 * What an architecture declares (biases, q/k norms, post-norms, windows, rope tables per
 * layer, attention sinks, an o_proj bias, GELU-tanh, a scaled embedding) comes in
 * decode_model.h's per-layer tables; a mixture layer's router and experts are
 * decode_experts.h's (one loop more than a dense MLP's, and each chosen expert's blocks
 * read once a step).
 *
 * Rows on a LoRA adapter (batch row_slots) get their adapter's delta after each
 * projection, from the worker's slot store (decode_lora.h); a step of base rows only
 * computes nothing more.
 *
 * From `vnni_from_m` tokens, where the CPU has AVX-512 VNNI, the projections take the
 * 16-bit activation blocks and integer dot products of compute/kernels/qblock_vnni.c,
 * as QBlockLinear does from the same number of rows: the Python path's arithmetic.
 * From `bf16_from_m` tokens, BF16 rows take the vdpbf16ps panels of
 * compute/kernels/qblock_bf16_panel.c: the activations rounded to bfloat16, as the Python
 * path's torch bfloat16 GEMM rounds them (models/qblock/native.py says from which M).
 *
 * Threads share out each projection's panels of output rows and the attention's
 * (token, kv head) items; five barriers a layer, the step's own (step_team.h), so that
 * the process's OpenMP wait policy only matters at the region's start and end. The norms
 * (a few hundred floats a row) and the VNNI path's activation blocks are computed by
 * every thread for itself, which costs less than a barrier.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../../compute/kernels/qblock_gemm.h"
#include "../../../compute/kernels/qblock_vnni.h"
#include "decode_attention.h"
#include "decode_experts.h"
#include "decode_lora.h"
#include "decode_model.h"
#include "decode_panels.h"
#include "decode_rows.h"
#include "step_team.h"

static void run_layer(const struct decode_model *m, const struct decode_batch *b,
                      int variant, int64_t layer, const struct scratch *s,
                      const struct attention_split *split, const struct lora_step *lora,
                      const struct thread_scratch *ts, struct member *me)
{
    const int64_t T = b->num_tokens, H = m->hidden, I = m->intermediate;
    const int64_t qkv_width = (m->num_heads + 2 * m->num_kv_heads) * m->head_dim;
    const int64_t q_width = m->num_heads * m->head_dim;
    const float eps = (float)m->eps;
    const struct block_weight *weights = m->weights + layer * PROJS;
    struct lora_delta d;
    const struct lora_delta *delta;

    rms_norm_rows(s->hidden, NULL, T, (const float *)m->norms[layer * NORMS + NORM_INPUT], H, eps,
                  ts->normed);
    prepare_input(ts, &weights[PROJ_QKV], ts->normed, T, H);
    delta = shrunk_delta(m, lora, layer, PROJ_QKV, ts->normed, H, &d, me);
    FOR_SHARED(p, panels_of(qkv_width), me, me->dynamic)
    {
        float *y = s->qkv + p * QBLOCK_PANEL_ROWS;
        const int64_t n = panel_rows(qkv_width, p);
        lora_prefetch_rows(delta, p * QBLOCK_PANEL_ROWS, n);
        project_rows(variant, &weights[PROJ_QKV], p * QBLOCK_PANEL_ROWS, n, ts->normed, T, H, y,
                     qkv_width, ts);
        lora_expand_rows(delta, p * QBLOCK_PANEL_ROWS, n, y, qkv_width);
    }
    share_end(me);
    /* Dynamic always: contexts differ, so items are not equal work. Rows of one sequence
     * (a speculative step's drafts) attend to each other's K/V, and the parts of a split
     * item (decode_attention.h) to the token's own: then every item's K/V is written
     * before any item attends, at the cost of one more barrier. */
    const int64_t items = T * m->num_kv_heads;
    const int split_items = split->parts > 1;
    if (b->chained || split_items) {
        FOR_SHARED(item, items, me, 1)
        prepare_item(m, b, layer, item / m->num_kv_heads, item % m->num_kv_heads,
                     s->qkv + (item / m->num_kv_heads) * qkv_width);
        share_end(me);
    }
    if (split_items) {
        FOR_SHARED(unit, items * split->parts, me, 1)
        attend_unit(m, b, layer, unit, split, s->qkv, qkv_width, s->attended, q_width,
                    ts->scores);
        share_end(me);
    } else {
        FOR_SHARED(item, items, me, 1)
        {
            int64_t t = item / m->num_kv_heads, kv_head = item % m->num_kv_heads;
            if (!b->chained)
                prepare_item(m, b, layer, t, kv_head, s->qkv + t * qkv_width);
            attend_prepared(m, b, layer, t, kv_head, s->qkv + t * qkv_width,
                            s->attended + t * q_width, ts->scores);
        }
        share_end(me);
    }
    const float *post_attention = (const float *)m->post_norms[layer * 2];
    const float *post_mlp = (const float *)m->post_norms[layer * 2 + 1];
    prepare_input(ts, &weights[PROJ_O], s->attended, T, q_width);
    delta = shrunk_delta(m, lora, layer, PROJ_O, s->attended, q_width, &d, me);
    add_projection(m, variant, &weights[PROJ_O], s->attended, T, q_width,
                   (const float *)m->o_biases[layer], delta, post_attention, s, ts, me);
    rms_norm_rows(s->hidden, NULL, T, (const float *)m->norms[layer * NORMS + NORM_POST], H, eps,
                  ts->normed);
    if (m->num_experts > 0 && m->moe_layers[layer].sparse) {
        run_experts(m, &m->moe_layers[layer], variant, T, post_mlp, s, ts, me);
        return;
    }
    prepare_input(ts, &weights[PROJ_GATE_UP], ts->normed, T, H);
    delta = shrunk_delta(m, lora, layer, PROJ_GATE_UP, ts->normed, H, &d, me);
    FOR_SHARED(p, panels_of(I), me, me->dynamic)
    swiglu_panel(variant, &weights[PROJ_GATE_UP], p, I, ts->normed, T, H, s->act,
                 (int)m->activation, delta, ts);
    share_end(me);
    prepare_input(ts, &weights[PROJ_DOWN], s->act, T, I);
    delta = shrunk_delta(m, lora, layer, PROJ_DOWN, s->act, I, &d, me);
    add_projection(m, variant, &weights[PROJ_DOWN], s->act, T, I, NULL, delta, post_mlp, s, ts,
                   me);
}

static int64_t longest_context(const struct decode_batch *b)
{
    int64_t longest = 1;
    for (int64_t t = 0; t < b->num_tokens; t++)
        longest = b->context_lens[t] > longest ? b->context_lens[t] : longest;
    return longest;
}

/* One thread's part of the whole step, inside the parallel region. */
static void run_step(const struct decode_model *m, const struct decode_batch *b,
                     int variant, const struct scratch *s,
                     const struct attention_split *split, int layers_vnni, int head_vnni,
                     int small_vnni, int64_t vnni_from_m, int64_t rows, int64_t max_k,
                     const struct lora_step *lora, struct step_team *team)
{
    const int64_t H = m->hidden, S = b->num_samples;
    struct member me = {.team = team,
                        .id = omp_get_thread_num(),
                        .dynamic = b->schedule == SCHEDULE_DYNAMIC,
                        .loop = 0};
    struct thread_scratch ts = thread_part(s, rows, H, max_k, layers_vnni, small_vnni);
    ts.vnni_from_m = vnni_from_m; /* experts decide by their own rows (decode_experts.h) */
    ts.bf16 = bf16_panel_rows(b, b->num_tokens);
    for (int64_t layer = 0; layer < m->num_layers; layer++)
        run_layer(m, b, variant, layer, s, split, lora, &ts, &me);
    /* The head, for the sampled rows only; the region's end is its barrier. */
    rms_norm_rows(s->hidden, b->sample_rows, S, m->final_norm, H, (float)m->eps, ts.normed);
    ts.vnni = head_vnni;
    ts.bf16 = bf16_panel_rows(b, S);
    prepare_input(&ts, m->lm_head, ts.normed, S, H);
    FOR_SHARED(p, panels_of(m->vocab), &me, me.dynamic)
    project_rows(variant, m->lm_head, p * QBLOCK_PANEL_ROWS, panel_rows(m->vocab, p), ts.normed,
                 S, H, b->logits + p * QBLOCK_PANEL_ROWS, m->vocab, &ts);
}

/* Returns 0; -1 for a variant this CPU cannot run, -2 for a shape the step does not
 * handle, -3 when its scratch could not be allocated, -4 when OpenMP gave it fewer
 * threads than asked (nothing computed). */
int decode_step(const struct decode_model *m, const struct decode_batch *b)
{
    const int variant = qblock_resolve_variant((int)b->variant);
    if (variant < 0)
        return -1;
    const int64_t T = b->num_tokens, H = m->hidden, I = m->intermediate, S = b->num_samples;
    if (T <= 0 || S < 0 || H % 32 || I % 32 || m->head_dim % 2 || m->num_heads % m->num_kv_heads)
        return -2;
    if (b->kv_dtype != KV_FLOAT32 && b->kv_dtype != KV_FLOAT16)
        return -2;
    const int64_t qkv_width = (m->num_heads + 2 * m->num_kv_heads) * m->head_dim;
    const int64_t q_width = m->num_heads * m->head_dim;
    const int64_t E = m->num_experts, k = m->experts_per_token, expert_I = m->expert_intermediate;
    const int64_t shared_I = E > 0 ? m->shared_intermediate : 0;
    if (q_width % 32 || shared_I % 32 || shared_I < 0 ||
        (E > 0 && (k < 1 || k > E || k > TOPK_MAX_K || expert_I % 32 || m->moe_layers == NULL)))
        return -2;
    const int threads = b->threads > 0 ? (int)b->threads : 1;
    int64_t max_k = I > q_width ? (I > H ? I : H) : (q_width > H ? q_width : H);
    max_k = expert_I > max_k ? expert_I : max_k;
    max_k = shared_I > max_k ? shared_I : max_k;
    const int64_t group = m->num_heads / m->num_kv_heads;
    const int64_t rows = T > S ? T : S;

    const int vnni_ok = b->vnni_from_m > 0 && qblock_vnni_supported();
    const int layers_vnni = vnni_ok && T >= b->vnni_from_m;
    const int head_vnni = vnni_ok && S >= b->vnni_from_m;
    /* Below vnni_from_m, Q5_0's, Q4_K's and Q6_K's rows take the VNNI kernel's small tiles
     * (decode_panels.h): wherever the VNNI kernel may run (its 16-bit activations; off
     * with CBSERVE_QBLOCK_VNNI=0, which leaves vnni_from_m 0), and in the AVX-512 variant
     * only: the plain and AVX2 variants stay what they name. */
    const int small_vnni = vnni_ok && variant == QBLOCK_VARIANT_AVX512;

    struct scratch s;
    s.per_thread = thread_floats(rows, H, max_k, group * longest_context(b)) +
                   expert_thread_floats(m, T);
    const int64_t choices = E > 0 ? T * k : 0;
    const int64_t shared = 2 * T * H + T * qkv_width + T * q_width + T * I +
                           round16(choices) * 2 + choices * expert_I +
                           (E > 0 ? shared_team_floats(m, T) : 0);
    float *mem = aligned_alloc(64, sizeof(float) * (shared + s.per_thread * threads));
    struct step_team team = {.threads = threads, .spin = (int)b->spin};
    atomic_init(&team.arrived, 0);
    atomic_init(&team.generation, 0);
    atomic_init(&team.sleepers, 0);
    /* One counter for each shared-out loop: five a layer and the head's, and a shrink
     * before each projection where some row has an adapter (decode_lora.h). */
    struct lora_step lora;
    void *lora_mem;
    const int lora_status = lora_step_prepare(m, b, &lora, &lora_mem);
    team.counters = calloc((LOOPS_PER_LAYER + LORA_LOOPS_PER_LAYER) * m->num_layers + 1,
                           sizeof(atomic_long));
    const int64_t items = T * m->num_kv_heads;
    struct attention_split split = {.parts = attention_parts(items, threads, longest_context(b))};
    float *split_mem = NULL;
    if (split.parts > 1) {
        split_mem = malloc(sizeof(float) * items * split.parts * group * (m->head_dim + 2));
        split.remaining = malloc(sizeof(atomic_int) * m->num_layers * items);
    }
    if (mem == NULL || team.counters == NULL || lora_status != 0 ||
        (split.parts > 1 && (split_mem == NULL || split.remaining == NULL))) {
        free(lora_mem);
        free(mem);
        free(team.counters);
        free(split_mem);
        free((void *)split.remaining);
        return lora_status == -2 ? -2 : -3;
    }
    if (split.parts > 1) {
        split.partials = split_mem;
        split.stats = split_mem + items * split.parts * group * m->head_dim;
        for (int64_t i = 0; i < m->num_layers * items; i++)
            atomic_init(&split.remaining[i], (int)split.parts);
    }
    s.thread_mem = mem;
    s.hidden = mem + s.per_thread * threads;
    s.qkv = s.hidden + T * H;
    s.attended = s.qkv + T * qkv_width;
    s.act = s.attended + T * q_width;
    s.projected = s.act + T * I;
    s.chosen = (int32_t *)(s.projected + T * H);
    s.route_weights = s.projected + T * H + round16(choices);
    s.expert_act = s.route_weights + round16(choices);
    for (int64_t t = 0; t < T; t++)
        memcpy(s.hidden + t * H, m->embed + b->token_ids[t] * H, sizeof(float) * H);
    if (m->embed_scale != 0.0) {
        const float scale = (float)m->embed_scale;
        for (int64_t i = 0; i < T * H; i++)
            s.hidden[i] *= scale;
    }

    int short_team = 0;
#pragma omp parallel num_threads(threads)
    {
        /* The barrier counts `threads`: a smaller team (OMP_DYNAMIC, a thread limit)
         * must not enter it, and leaves the work to the Python path. */
        if (omp_get_num_threads() != threads) {
#pragma omp atomic write
            short_team = 1;
        }
#pragma omp barrier
        if (!short_team)
            run_step(m, b, variant, &s, &split, layers_vnni, head_vnni, small_vnni,
                     vnni_ok ? b->vnni_from_m : 0, rows, max_k, &lora, &team);
    }
    free(team.counters);
    free(split_mem);
    free((void *)split.remaining);
    free(lora_mem);
    free(mem);
    return short_team ? -4 : 0;
}

/* torch.topk's k indices of values[0 .. n) (decode_topk.h), for tests; -1: no memory. */
int decode_topk(const float *values, int64_t n, int64_t k, int64_t *indices)
{
    struct scored *queue = malloc(sizeof(struct scored) * n);
    if (queue == NULL)
        return -1;
    torch_topk(values, n, k, queue);
    for (int64_t j = 0; j < k; j++)
        indices[j] = queue[j].index;
    free(queue);
    return 0;
}
