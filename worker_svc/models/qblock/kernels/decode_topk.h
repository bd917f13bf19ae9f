/* The k largest of n router scores, chosen exactly as torch.topk chooses them on a CPU,
 * ties included (the Python forward's route(), models/forward/experts.py).
 *
 * torch.topk (ATen's TopKImpl.h) puts (value, index) pairs in a vector and orders them
 * by value alone (NaN largest): with std::partial_sort where k * 64 <= n, else with
 * std::nth_element and then std::sort of the first k - 1. Neither is stable, so which of
 * two equal scores wins depends on those algorithms' steps (it is not "the lower index
 * first": with four equal scores and k = 1 it is index 2). This file takes the same
 * steps as libstdc++'s heap select, introselect and insertion sort, so that a tie picks
 * the same experts as the Python forward; tests/worker/test_native_experts.py checks it
 * against torch.topk on tie-heavy rows. std::sort of at most 16 pairs is an insertion
 * sort, so k is at most 17 (decode_step refuses more). */
#ifndef CBSERVE_DECODE_TOPK_H
#define CBSERVE_DECODE_TOPK_H

#include <math.h>
#include <stdint.h>

enum { TOPK_MAX_K = 17 };

struct scored {
    float value;
    int32_t index;
};

/* torch's "largest" comparator: a before b. */
static int topk_before(struct scored a, struct scored b)
{
    return (isnan(a.value) && !isnan(b.value)) || a.value > b.value;
}

static void topk_swap(struct scored *q, int64_t i, int64_t j)
{
    struct scored t = q[i];
    q[i] = q[j], q[j] = t;
}

static void topk_adjust_heap(struct scored *q, int64_t hole, int64_t len, struct scored value)
{
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (topk_before(q[child], q[child - 1]))
            child--;
        q[hole] = q[child], hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        q[hole] = q[child - 1], hole = child - 1;
    }
    int64_t parent = (hole - 1) / 2;
    while (hole > top && topk_before(q[parent], value)) {
        q[hole] = q[parent], hole = parent;
        parent = (hole - 1) / 2;
    }
    q[hole] = value;
}

static void topk_pop_heap(struct scored *q, int64_t len, int64_t result)
{
    struct scored value = q[result];
    q[result] = q[0];
    topk_adjust_heap(q, 0, len, value);
}

/* The `middle` best of q[0 .. last) into q[0 .. middle), as a heap. */
static void topk_heap_select(struct scored *q, int64_t middle, int64_t last)
{
    if (middle >= 2)
        for (int64_t parent = (middle - 2) / 2; parent >= 0; parent--)
            topk_adjust_heap(q, parent, middle, q[parent]);
    for (int64_t i = middle; i < last; i++)
        if (topk_before(q[i], q[0]))
            topk_pop_heap(q, middle, i);
}

static void topk_insertion_sort(struct scored *q, int64_t first, int64_t last)
{
    for (int64_t i = first + 1; i < last; i++) {
        struct scored value = q[i];
        if (topk_before(value, q[first])) {
            for (int64_t j = i; j > first; j--)
                q[j] = q[j - 1];
            q[first] = value;
        } else {
            int64_t j = i;
            for (; topk_before(value, q[j - 1]); j--)
                q[j] = q[j - 1];
            q[j] = value;
        }
    }
}

/* libstdc++'s median of three, moved to q[result]. */
static void topk_median_to_first(struct scored *q, int64_t result, int64_t a, int64_t b,
                                 int64_t c)
{
    int64_t pick;
    if (topk_before(q[a], q[b]))
        pick = topk_before(q[b], q[c]) ? b : topk_before(q[a], q[c]) ? c : a;
    else
        pick = topk_before(q[a], q[c]) ? a : topk_before(q[b], q[c]) ? c : b;
    topk_swap(q, result, pick);
}

static int64_t topk_partition(struct scored *q, int64_t first, int64_t last, int64_t pivot)
{
    for (;;) {
        while (topk_before(q[first], q[pivot]))
            first++;
        last--;
        while (topk_before(q[pivot], q[last]))
            last--;
        if (first >= last)
            return first;
        topk_swap(q, first, last);
        first++;
    }
}

static void topk_introselect(struct scored *q, int64_t nth, int64_t last)
{
    int64_t first = 0, depth = 0;
    for (int64_t n = last; n > 1; n >>= 1)
        depth += 2; /* 2 * floor(log2(n)) */
    while (last - first > 3) {
        if (depth == 0) {
            topk_heap_select(q + first, nth + 1 - first, last - first);
            topk_swap(q, first, nth);
            return;
        }
        depth--;
        topk_median_to_first(q, first, first + 1, first + (last - first) / 2, last - 1);
        const int64_t cut = topk_partition(q, first + 1, last, first);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    topk_insertion_sort(q, first, last);
}

/* q[0 .. k) = torch.topk(values, k)'s (value, index) pairs, in its order; q holds n. */
static void torch_topk(const float *values, int64_t n, int64_t k, struct scored *q)
{
    for (int64_t i = 0; i < n; i++)
        q[i].value = values[i], q[i].index = (int32_t)i;
    if (k * 64 <= n) {
        topk_heap_select(q, k, n);
        for (int64_t last = k; last > 1; last--) /* sort_heap */
            topk_pop_heap(q, last - 1, last - 1);
    } else {
        topk_introselect(q, k - 1, n);
        topk_insertion_sort(q, 0, k - 1);
    }
}

#endif
