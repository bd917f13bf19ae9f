/* The peak rate of one multiply-accumulate instruction on this CPU: a tight loop of it
 * on ACCUMULATORS independent registers, on every thread asked for.
 *
 * Compiled once per instruction (bench/roofline/peak.py), with one of the PEAK_* macros
 * and only the -m flags that instruction needs, so a compiler or CPU that lacks one
 * instruction loses that row only. Twelve accumulators: each instruction's latency
 * (4-6 cycles) times the vector pipes that issue it (1-2 a cycle) is at most 12 in
 * flight, so the loop is bound by throughput, never by a dependency chain; twelve plus
 * the two inputs fit in 16 registers, the most an AVX2 CPU has.
 *
 * The inputs come from the caller's memory and every accumulator is summed into the
 * result, so the compiler can neither fold the loop nor drop it.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define ACCUMULATORS 12

#if defined(PEAK_VPDPBUSD) || defined(PEAK_VPDPWSSD)
typedef __m512i acc_t;
#define START(j) _mm512_set1_epi32(j)
#define INPUT(seed) _mm512_set1_epi32((int32_t)(seed))
#define SUM(v) ((double)_mm512_reduce_add_epi32(v))
#if defined(PEAK_VPDPBUSD)
#define STEP(acc, a, b) _mm512_dpbusd_epi32((acc), (a), (b))  /* 64 u8*s8 products */
#else
#define STEP(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))  /* 32 s16*s16 products */
#endif
typedef __m512i input_t;
#elif defined(PEAK_VDPBF16PS)
typedef __m512 acc_t;
typedef __m512bh input_t;
#define START(j) _mm512_set1_ps((float)(j))
#define INPUT(seed) _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(seed))
#define SUM(v) ((double)_mm512_reduce_add_ps(v))
#define STEP(acc, a, b) _mm512_dpbf16_ps((acc), (a), (b))  /* 32 bf16 products */
#elif defined(PEAK_FMA_ZMM)
typedef __m512 acc_t;
typedef __m512 input_t;
#define START(j) _mm512_set1_ps((float)(j))
#define INPUT(seed) _mm512_set1_ps(seed)
#define SUM(v) ((double)_mm512_reduce_add_ps(v))
#define STEP(acc, a, b) _mm512_fmadd_ps((a), (b), (acc))  /* 16 float products */
#elif defined(PEAK_FMA_YMM)
typedef __m256 acc_t;
typedef __m256 input_t;
#define START(j) _mm256_set1_ps((float)(j))
#define INPUT(seed) _mm256_set1_ps(seed)
#define STEP(acc, a, b) _mm256_fmadd_ps((a), (b), (acc))  /* 8 float products */
static double SUM(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    double total = 0;
    for (int i = 0; i < 8; i++) total += lanes[i];
    return total;
}
#else
#error "compile with one of PEAK_VPDPBUSD, PEAK_VPDPWSSD, PEAK_VDPBF16PS, PEAK_FMA_ZMM, PEAK_FMA_YMM"
#endif

/* Every accumulator by name, not an array: an array may be kept in memory (gcc -O2
 * does), which would time loads and stores instead of the instruction. Each starts
 * from its own value: twelve equal chains are one chain to the compiler, which then
 * keeps one (gcc does), and the loop times latency instead of throughput. */
#define EACH_ACCUMULATOR(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECLARE(j) acc_t acc##j = START(j);
#define ADVANCE(j) acc##j = STEP(acc##j, a, b);
#define ADD(j) total += SUM(acc##j);

static double one_thread(int64_t iterations, const float *seeds) {
    /* Small inputs: float sums grow by about 1e-6 a step, far from overflow and from
     * denormals (either could slow the loop); integer sums wrap, which costs nothing. */
    const input_t a = INPUT(seeds[0]);
    const input_t b = INPUT(seeds[1]);
    EACH_ACCUMULATOR(DECLARE)
    for (int64_t i = 0; i < iterations; i++) {
        EACH_ACCUMULATOR(ADVANCE)
    }
    double total = 0;
    EACH_ACCUMULATOR(ADD)
    return total;
}

int roofline_instructions_per_iteration(void) { return ACCUMULATORS; }

/* Runs `iterations` of the loop on each of `threads` threads, timed from a barrier all
 * have reached to one all have reached. Returns the threads that ran (OpenMP may give
 * fewer than asked); `*seconds` the wall time, `*sink` the sum of the accumulators. */
int roofline_peak(int threads, int64_t iterations, const float *seeds, double *seconds,
                  double *sink) {
    double start = 0, end = 0, total = 0;
    int ran = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
#pragma omp single
        ran = omp_get_num_threads();
        /* single's implied barrier: every thread is up before the clock starts. */
#pragma omp master
        start = omp_get_wtime();
#pragma omp barrier
        total += one_thread(iterations, seeds);
#pragma omp barrier
#pragma omp master
        end = omp_get_wtime();
    }
    *seconds = end - start;
    *sink = total;
    return ran;
}
