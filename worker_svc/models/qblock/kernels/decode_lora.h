/* LoRA adapters in the native decode step (decode_step.c), read from the worker's slot
 * store (worker_svc/lora/slots.py) in place: for every layer and fused projection (qkv,
 * o, gate/up, down) an a [slots, parts * rank, in] and b [slots, parts * rank, out],
 * float32 or bfloat16 (widened as read), slot 0 the base's zeros, part p of a fused
 * projection in rows p * rank.. of both, in b under its own output columns only
 * (block-diagonal), the scaling folded into b. A row on slot s gets (a[s] @ x) @ b[s]
 * added to the projection's output. Of each part only the rows of the slot's own rank
 * (lora_ranks) are read: an adapter below the store's max rank costs its own rank.
 *
 * The step's rows are grouped by slot before the parallel region (Punica's segments), so
 * that each adapter's a and b are read once a step whatever its number of rows, and base
 * rows cost nothing. Before a projection's panels the team shares out the shrink (chunks
 * of an adapter's A rows: `t = a @ x` into `shrunk`), then a barrier; each thread's
 * panels then add the expand of their own output rows, before the panel's next use (the
 * residual add, SiLU, the attention's bias and rotary): where the Python path adds its
 * delta, to the projection's float32 output. b's zero blocks are never read: a panel's
 * output columns of a part read that part's rank rows of b only, each a contiguous run
 * (b as [out, parts * rank] rows would have the hardware fetch the other parts' zeros
 * beside each row's few floats, as it fetches lines in pairs: measured, a third to a
 * half of the step's time at one row). The Python projection adds its bias
 * before the delta, as residual_panel does; the qkv bias (added per item with rotary)
 * and a post-normed projection's bias (added per row) come after it here, which only
 * changes the last bit of a sum. */
#ifndef CBSERVE_DECODE_LORA_H
#define CBSERVE_DECODE_LORA_H

#include <stdint.h>
#include <stdlib.h>

#include "decode_model.h"
#include "step_team.h"

/* decode_lora.c: each for a float32 store and for a bfloat16 one (uint16_t elements) */
void lora_shrink(const float *a, int64_t count, int64_t in, const float *x, int64_t ldx,
                 const int64_t *rows, int64_t n_rows, float *shrunk, int64_t width);
void lora_expand(const float *b, int64_t ldb, int64_t n, int64_t rank, const float *shrunk,
                 int64_t width, const int64_t *rows, int64_t n_rows, float *y, int64_t ldy);
void lora_shrink_bf16(const uint16_t *a, int64_t count, int64_t in, const float *x, int64_t ldx,
                      const int64_t *rows, int64_t n_rows, float *shrunk, int64_t width);
void lora_expand_bf16(const uint16_t *b, int64_t ldb, int64_t n, int64_t rank,
                      const float *shrunk, int64_t width, const int64_t *rows, int64_t n_rows,
                      float *y, int64_t ldy);

/* A rows of one shrink item: small enough that one adapter's o_proj (rank rows) is
 * several items for a team of a few threads at one row. */
enum { LORA_CHUNK = 8, LORA_LOOPS_PER_LAYER = 4, LORA_MAX_PARTS = 3 };

/* The step's adapter rows, grouped by slot; NULL (no group) when every row is the base. */
struct lora_step {
    int64_t count;        /* distinct non-zero slots among the rows */
    int64_t rank, width;  /* the store's max rank; `shrunk`'s row stride (3 * rank) */
    int64_t bf16;         /* the store's a and b are bfloat16 */
    const int32_t *slot;  /* [count] */
    const int32_t *ranks; /* [count]: each group's adapter rank (rows read per part) */
    const int64_t *start; /* [count + 1]: group g is rows[start[g] .. start[g + 1]) */
    const int64_t *rows;  /* the rows of every group, group after group */
    float *shrunk;        /* [T, width]: a @ x of each adapter row, this projection's */
};

/* One projection's delta in one layer, for this step. */
struct lora_delta {
    const struct lora_step *step;
    const void *a, *b; /* float or uint16_t (bfloat16), as the step's `bf16` */
    int64_t in, out, parts;
    int64_t part_end[LORA_MAX_PARTS]; /* the output row after part p's last */
};

/* Groups the rows by slot, in order of first appearance; returns the number of groups,
 * -1 for a slot outside 0 .. slots - 1. `slot`, `rows`: [T], `start`: [T + 1]. */
static int64_t lora_group_rows(const int32_t *row_slots, int64_t T, int64_t slots, int32_t *slot,
                               int64_t *start, int64_t *rows)
{
    int64_t count = 0, placed = 0;
    for (int64_t t = 0; t < T; t++) {
        if (row_slots[t] < 0 || row_slots[t] >= slots)
            return -1;
        int64_t g = 0;
        while (g < count && slot[g] != row_slots[t])
            g++;
        if (row_slots[t] != 0 && g == count)
            slot[count++] = row_slots[t];
    }
    for (int64_t g = 0; g < count; g++) {
        start[g] = placed;
        for (int64_t t = 0; t < T; t++)
            if (row_slots[t] == slot[g])
                rows[placed++] = t;
    }
    start[count] = placed;
    return count;
}

/* The step's groups (l->count 0: every row is the base, or row_slots NULL), their
 * arrays and `shrunk` in one allocation `*mem` for the caller to free. Returns 0, -2 for
 * a slot outside the store or adapter rows without one, -3 without memory. */
static int lora_step_prepare(const struct decode_model *m, const struct decode_batch *b,
                             struct lora_step *l, void **mem)
{
    const int64_t T = b->num_tokens;
    *l = (struct lora_step){.rank = m->lora_rank,
                            .width = LORA_MAX_PARTS * m->lora_rank,
                            .bf16 = m->lora_bf16};
    *mem = NULL;
    if (b->row_slots == NULL)
        return 0;
    /* `shrunk`, which the team writes while it reads the groups, in cache lines of its
     * own: sharing one with them cost 0.5 ms of a 6 ms step at one row (measured). */
    const size_t groups = (sizeof(int64_t) * (4 * T + 1) + 63) / 64 * 64;
    *mem = aligned_alloc(64, groups + (sizeof(float) * T * l->width + 63) / 64 * 64);
    if (*mem == NULL)
        return -3;
    int64_t *start = *mem, *rows = start + T + 1;
    int32_t *slot = (int32_t *)(rows + T), *ranks = (int32_t *)(rows + 2 * T);
    l->count = lora_group_rows(b->row_slots, T, m->lora == NULL ? 1 : m->lora_slots, slot,
                               start, rows);
    l->slot = slot, l->ranks = ranks, l->start = start, l->rows = rows;
    l->shrunk = (float *)((char *)*mem + groups);
    for (int64_t g = 0; g < l->count; g++) /* a rank outside 0 .. max: the whole part */
        ranks[g] = m->lora_ranks == NULL || m->lora_ranks[slot[g]] < 0 ||
                           m->lora_ranks[slot[g]] > l->rank
                       ? (int32_t)l->rank
                       : m->lora_ranks[slot[g]];
    return l->count < 0 ? -2 : 0;
}

/* Projection `proj` of `layer`'s delta; 0 when the step has no adapter row or the layer
 * no such projection in the store (a mixture layer's MLP). */
static int lora_delta_of(const struct decode_model *m, const struct lora_step *l, int64_t layer,
                         int proj, struct lora_delta *d)
{
    if (l->count == 0)
        return 0;
    const int64_t *addresses = m->lora + (layer * PROJS + proj) * 2;
    if (addresses[0] == 0)
        return 0;
    const int64_t H = m->hidden, I = m->intermediate, d_head = m->head_dim;
    const int64_t q_width = m->num_heads * d_head, kv_width = m->num_kv_heads * d_head;
    *d = (struct lora_delta){.step = l,
                             .a = (const void *)addresses[0],
                             .b = (const void *)addresses[1],
                             .parts = 1};
    switch (proj) {
    case PROJ_QKV:
        d->in = H, d->parts = 3;
        d->part_end[0] = q_width, d->part_end[1] = q_width + kv_width;
        d->part_end[2] = q_width + 2 * kv_width;
        break;
    case PROJ_O:
        d->in = q_width, d->part_end[0] = H;
        break;
    case PROJ_GATE_UP:
        d->in = H, d->parts = 2, d->part_end[0] = I, d->part_end[1] = 2 * I;
        break;
    default: /* PROJ_DOWN */
        d->in = I, d->part_end[0] = H;
    }
    d->out = d->part_end[d->parts - 1];
    return 1;
}

/* Element `index` of a store array of the step's type. */
static inline const void *lora_at(const struct lora_step *l, const void *base, int64_t index)
{
    return (const char *)base + index * (l->bf16 ? 2 : 4);
}

/* The team's shrink of every adapter row's input x[t * ldx ..] (then its barrier): per
 * group and part, chunks of the part's first `ranks[g]` A rows (a chunk past them is
 * empty). */
static void lora_shrink_shared(const struct lora_delta *d, const float *x, int64_t ldx,
                               struct member *me)
{
    const struct lora_step *l = d->step;
    const int64_t R = d->parts * l->rank, chunks = (l->rank + LORA_CHUNK - 1) / LORA_CHUNK;
    FOR_SHARED(item, l->count * d->parts * chunks, me, me->dynamic)
    {
        const int64_t g = item / (d->parts * chunks), p = item / chunks % d->parts;
        const int64_t in_part = item % chunks * LORA_CHUNK, first = p * l->rank + in_part;
        const int64_t left = l->ranks[g] - in_part, count = left < LORA_CHUNK ? left : LORA_CHUNK;
        if (count <= 0)
            continue;
        const void *a = lora_at(l, d->a, ((int64_t)l->slot[g] * R + first) * d->in);
        const int64_t *rows = l->rows + l->start[g], n_rows = l->start[g + 1] - l->start[g];
        if (l->bf16)
            lora_shrink_bf16(a, count, d->in, x, ldx, rows, n_rows, l->shrunk + first, l->width);
        else
            lora_shrink(a, count, d->in, x, ldx, rows, n_rows, l->shrunk + first, l->width);
    }
    share_end(me);
}

/* For each adapter of the step and each part of output columns lo .. lo + n - 1 (a
 * panel's; one may cross from one part into the next): the part's rank rows of b, those
 * columns of each, then either y[t * ldy + j - lo] += the delta's output j of each of the
 * adapter's rows t, or (y NULL) a prefetch of them into L2. Each panel reads rank short
 * runs, one per row of b, which the hardware does not fetch ahead of as it does A's
 * rows: a panel prefetches them before its projection, whose time hides their latency. */
static void lora_panel(const struct lora_delta *d, int64_t lo, int64_t n, float *y, int64_t ldy)
{
    if (d == NULL)
        return;
    const struct lora_step *l = d->step;
    const int64_t R = d->parts * l->rank, line = l->bf16 ? 32 : 16; /* elements a line */
    for (int64_t g = 0; g < l->count; g++) {
        const int64_t rank = l->ranks[g], slot = l->slot[g];
        int64_t part_start = 0;
        for (int64_t p = 0; p < d->parts; part_start = d->part_end[p], p++) {
            const int64_t from = lo > part_start ? lo : part_start;
            const int64_t to = lo + n < d->part_end[p] ? lo + n : d->part_end[p];
            const int64_t part_b = (slot * R + p * l->rank) * d->out + from;
            for (int64_t r = 0; y == NULL && r < rank; r++)
                for (int64_t j = 0; j < to - from; j += line)
                    __builtin_prefetch(lora_at(l, d->b, part_b + r * d->out + j), 0, 2);
            if (y == NULL || from >= to)
                continue;
            const int64_t *rows = l->rows + l->start[g], n_rows = l->start[g + 1] - l->start[g];
            const float *t = l->shrunk + p * l->rank;
            if (l->bf16)
                lora_expand_bf16(lora_at(l, d->b, part_b), d->out, to - from, rank, t, l->width,
                                 rows, n_rows, y + (from - lo), ldy);
            else
                lora_expand(lora_at(l, d->b, part_b), d->out, to - from, rank, t, l->width, rows,
                            n_rows, y + (from - lo), ldy);
        }
    }
}

static void lora_prefetch_rows(const struct lora_delta *d, int64_t lo, int64_t n)
{
    lora_panel(d, lo, n, NULL, 0);
}

static void lora_expand_rows(const struct lora_delta *d, int64_t lo, int64_t n, float *y,
                             int64_t ldy)
{
    lora_panel(d, lo, n, y, ldy);
}

/* The adapter rows' delta of projection `proj` (NULL: none), its shrink done. */
static const struct lora_delta *shrunk_delta(const struct decode_model *m,
                                             const struct lora_step *lora, int64_t layer,
                                             int proj, const float *x, int64_t ldx,
                                             struct lora_delta *d, struct member *me)
{
    if (!lora_delta_of(m, lora, layer, proj, d))
        return NULL;
    lora_shrink_shared(d, x, ldx, me);
    return d;
}

#endif
