/* The native decode step's own synchronisation inside its one OpenMP parallel region:
 * a barrier that spins briefly and then sleeps, and work counters.
 *
 * libgomp's barriers follow OMP_WAIT_POLICY for the whole process: spinning (the
 * default) is fast while every thread has a core, but with other busy processes on the
 * cores a spinning thread holds the core its late team-mate needs, and a step of ~150
 * barriers went from 25 ms to 940 ms (bench/native_policy.py); PASSIVE sleeps at once
 * and pays a wake-up at every barrier. This barrier spins `spin` pauses (microseconds:
 * a balanced barrier's wait) and then sleeps on a futex, whatever the process policy.
 */
#ifndef CBSERVE_STEP_TEAM_H
#define CBSERVE_STEP_TEAM_H

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

struct step_team {
    atomic_int arrived, generation, sleepers;
    int threads; /* set before the parallel region: the team's size */
    int spin;
    atomic_long *counters; /* one per shared-out loop of the step, zeroed */
};

static inline void team_barrier(struct step_team *team)
{
    int generation = atomic_load(&team->generation);
    if (atomic_fetch_add(&team->arrived, 1) + 1 == team->threads) {
        atomic_store(&team->arrived, 0);
        atomic_fetch_add(&team->generation, 1);
        if (atomic_load(&team->sleepers) > 0)
            syscall(SYS_futex, &team->generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    for (int i = 0; i < team->spin; i++) {
        if (atomic_load_explicit(&team->generation, memory_order_acquire) != generation)
            return;
        _mm_pause();
    }
    /* The waker bumps the generation before it reads sleepers, and the wait returns at
     * once if the generation moved: no wake-up is lost (all sequentially consistent). */
    atomic_fetch_add(&team->sleepers, 1);
    while (atomic_load(&team->generation) == generation)
        syscall(SYS_futex, &team->generation, FUTEX_WAIT_PRIVATE, generation, NULL, NULL, 0);
    atomic_fetch_sub(&team->sleepers, 1);
}

/* The next item of shared-out loop `loop` (dynamic: whoever is free takes it). */
static inline int64_t team_next(struct step_team *team, int64_t loop)
{
    return atomic_fetch_add_explicit(&team->counters[loop], 1, memory_order_relaxed);
}

enum { SCHEDULE_DYNAMIC = 0, SCHEDULE_STATIC = 1 };

/* One thread of the step: its place in the team and the loops it has passed. */
struct member {
    struct step_team *team;
    int id, dynamic;
    int64_t loop;
};

/* A loop shared out by the team: static (thread i takes items i, i + threads, ...) or
 * dynamic (the next free item), then the team's barrier. */
static int64_t share_first(struct member *me, int dynamic)
{
    return dynamic ? team_next(me->team, me->loop) : me->id;
}

static int64_t share_next(struct member *me, int dynamic, int64_t item)
{
    return dynamic ? team_next(me->team, me->loop) : item + me->team->threads;
}

static void share_end(struct member *me)
{
    me->loop++;
    team_barrier(me->team);
}

#define FOR_SHARED(item, count, me, dynamic)                                                      \
    for (int64_t item = share_first(me, dynamic); item < (count);                                \
         item = share_next(me, dynamic, item))

#endif
