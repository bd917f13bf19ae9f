/* The native decode step's LoRA arithmetic (decode_lora.h says where the step applies
 * it): the shrink `t = a @ x` of a chunk of an adapter's A rows for the rows of one
 * group, and the expand `y += t @ b` of a range of output columns.
 *
 * Built apart from decode_step.c (-ffp-contract=off there), with fused multiply-adds:
 * the Python path's delta is torch's float32 matmul, which fuses too; the two differ in
 * the order of their sums only. Each A row is read once for every row of its group, and
 * four A rows go together against one input row, so that four sums are in flight (a
 * single running sum would wait on each add at one row, where the A rows are the step's
 * whole cost).
 *
 * Each function has a float32 and a bfloat16 form (the slot store's two element types,
 * worker_svc/lora/slots.py): a bfloat16 is a float32's high half, so it widens exactly
 * by a shift of 16 bits as it is loaded, on any CPU, and the sums are float32 in both. */
#include <stdint.h>

typedef uint16_t bf16_t;

static inline float load_f32(const float *p, int64_t k)
{
    return p[k];
}

static inline float load_bf16(const bf16_t *p, int64_t k)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)p[k] << 16};
    return v.f;
}

/* shrunk[rows[i] * width + r] = a[r] . x[rows[i]] for r < count: the A rows of a chunk
 * against each row of a group. */
#define DEFINE_SHRINK(NAME, T, LOAD)                                                             \
    void NAME(const T *a, int64_t count, int64_t in, const float *x, int64_t ldx,                \
              const int64_t *rows, int64_t n_rows, float *shrunk, int64_t width)                 \
    {                                                                                            \
        int64_t r = 0;                                                                           \
        for (; r + 4 <= count; r += 4) {                                                         \
            const T *a0 = a + r * in, *a1 = a0 + in, *a2 = a1 + in, *a3 = a2 + in;               \
            for (int64_t i = 0; i < n_rows; i++) {                                               \
                const float *xr = x + rows[i] * ldx;                                             \
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;                                \
                _Pragma("omp simd reduction(+ : s0, s1, s2, s3)") for (int64_t k = 0; k < in;    \
                                                                       k++)                      \
                {                                                                                \
                    s0 += LOAD(a0, k) * xr[k];                                                   \
                    s1 += LOAD(a1, k) * xr[k];                                                   \
                    s2 += LOAD(a2, k) * xr[k];                                                   \
                    s3 += LOAD(a3, k) * xr[k];                                                   \
                }                                                                                \
                float *out = shrunk + rows[i] * width + r;                                       \
                out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;                              \
            }                                                                                    \
        }                                                                                        \
        for (; r < count; r++) {                                                                 \
            const T *ar = a + r * in;                                                            \
            for (int64_t i = 0; i < n_rows; i++) {                                               \
                const float *xr = x + rows[i] * ldx;                                             \
                float sum = 0.0f;                                                                \
                _Pragma("omp simd reduction(+ : sum)") for (int64_t k = 0; k < in; k++) sum +=   \
                    LOAD(ar, k) * xr[k];                                                         \
                shrunk[rows[i] * width + r] = sum;                                               \
            }                                                                                    \
        }                                                                                        \
    }
DEFINE_SHRINK(lora_shrink, float, load_f32)
DEFINE_SHRINK(lora_shrink_bf16, bf16_t, load_bf16)

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
/* y[rows[i] * ldy + j] += sum over r of shrunk[rows[i] * width + r] * b[r * ldb + j], for
 * j < n: each row's delta summed apart first (as the Python path's matmul sums it
 * before adding), some output columns at a time; the expand of CPUs without AVX-512. */
#define DEFINE_EXPAND(NAME, T, LOAD)                                                             \
    void NAME(const T *b, int64_t ldb, int64_t n, int64_t rank, const float *shrunk,             \
              int64_t width, const int64_t *rows, int64_t n_rows, float *y, int64_t ldy)         \
    {                                                                                            \
        enum { COLUMNS = 64 };                                                                   \
        for (int64_t lo = 0; lo < n; lo += COLUMNS) {                                            \
            const int64_t cols = n - lo < COLUMNS ? n - lo : COLUMNS;                            \
            for (int64_t i = 0; i < n_rows; i++) {                                               \
                const float *t = shrunk + rows[i] * width;                                       \
                float delta[COLUMNS] = {0.0f};                                                   \
                for (int64_t r = 0; r < rank; r++) {                                             \
                    const T *br = b + r * ldb + lo;                                              \
                    const float tr = t[r];                                                       \
                    _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) delta[j] +=           \
                        tr * LOAD(br, j);                                                        \
                }                                                                                \
                float *out = y + rows[i] * ldy + lo;                                             \
                _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) out[j] += delta[j];       \
            }                                                                                    \
        }                                                                                        \
    }
DEFINE_EXPAND(lora_expand, float, load_f32)
DEFINE_EXPAND(lora_expand_bf16, bf16_t, load_bf16)
#else
#include <immintrin.h>

static inline __m512 load16_f32(const float *p, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, p);
}

static inline __m512 load16_bf16(const bf16_t *p, __mmask16 m)
{
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* 32 columns (fewer: masks m0, m1) of `ROWS` rows' deltas in registers, each run of b
 * loaded once for all of them: a delta kept in memory (the portable loop as GCC
 * compiles it) chains every multiply-add through a store and a load. */
#define EXPAND_TILE(NAME, T, LOAD, ROWS)                                                        \
    static void NAME##_##ROWS(const T *b, int64_t ldb, int64_t rank, const float *const *t,     \
                              float *const *out, __mmask16 m0, __mmask16 m1)                    \
    {                                                                                           \
        __m512 acc[ROWS][2];                                                                    \
        for (int k = 0; k < ROWS; k++)                                                          \
            acc[k][0] = acc[k][1] = _mm512_setzero_ps();                                        \
        for (int64_t r = 0; r < rank; r++) {                                                    \
            const __m512 b0 = LOAD(b + r * ldb, m0), b1 = LOAD(b + r * ldb + 16, m1);           \
            for (int k = 0; k < ROWS; k++) {                                                    \
                const __m512 tk = _mm512_set1_ps(t[k][r]);                                      \
                acc[k][0] = _mm512_fmadd_ps(tk, b0, acc[k][0]);                                 \
                acc[k][1] = _mm512_fmadd_ps(tk, b1, acc[k][1]);                                 \
            }                                                                                   \
        }                                                                                       \
        for (int k = 0; k < ROWS; k++) {                                                        \
            _mm512_mask_storeu_ps(out[k], m0,                                                   \
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m0, out[k]), acc[k][0])); \
            _mm512_mask_storeu_ps(out[k] + 16, m1,                                              \
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m1, out[k] + 16),         \
                                                acc[k][1]));                                    \
        }                                                                                       \
    }

#define DEFINE_EXPAND(NAME, T, LOAD)                                                             \
    EXPAND_TILE(NAME##_tile, T, LOAD, 1)                                                         \
    EXPAND_TILE(NAME##_tile, T, LOAD, 2)                                                         \
    EXPAND_TILE(NAME##_tile, T, LOAD, 3)                                                         \
    EXPAND_TILE(NAME##_tile, T, LOAD, 4)                                                         \
    void NAME(const T *b, int64_t ldb, int64_t n, int64_t rank, const float *shrunk,             \
              int64_t width, const int64_t *rows, int64_t n_rows, float *y, int64_t ldy)         \
    {                                                                                            \
        for (int64_t lo = 0; lo < n; lo += 32) {                                                 \
            const int64_t cols = n - lo < 32 ? n - lo : 32;                                      \
            const __mmask16 m0 = (__mmask16)(((uint64_t)1 << (cols < 16 ? cols : 16)) - 1);     \
            const __mmask16 m1 = (__mmask16)(((uint64_t)1 << (cols > 16 ? cols - 16 : 0)) - 1);  \
            for (int64_t i = 0; i < n_rows; i += 4) {                                            \
                const float *t[4];                                                               \
                float *out[4];                                                                   \
                const int64_t tile = n_rows - i < 4 ? n_rows - i : 4;                            \
                for (int64_t k = 0; k < tile; k++) {                                             \
                    t[k] = shrunk + rows[i + k] * width;                                         \
                    out[k] = y + rows[i + k] * ldy + lo;                                         \
                }                                                                                \
                if (tile == 4)                                                                   \
                    NAME##_tile_4(b + lo, ldb, rank, t, out, m0, m1);                            \
                else if (tile == 3)                                                              \
                    NAME##_tile_3(b + lo, ldb, rank, t, out, m0, m1);                            \
                else if (tile == 2)                                                              \
                    NAME##_tile_2(b + lo, ldb, rank, t, out, m0, m1);                            \
                else                                                                             \
                    NAME##_tile_1(b + lo, ldb, rank, t, out, m0, m1);                            \
            }                                                                                    \
        }                                                                                        \
    }
DEFINE_EXPAND(lora_expand, float, load16_f32)
DEFINE_EXPAND(lora_expand_bf16, bf16_t, load16_bf16)
#endif
