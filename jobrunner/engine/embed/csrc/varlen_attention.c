/* Bidirectional attention over packed sequences of mixed lengths, for encoder embedders on CPUs.
 *
 * The batch is the (T, 3D) output of the fused q/k/v projection before its bias (added here as
 * the rows are read), the sequences back to back (offsets in `cu`): every (sequence, head) pair
 * is one work item, so a batch of hundreds of distinct lengths is one call per layer, with no
 * padding, no mask tensor and no copy of the batch in or out (the context is written straight
 * into its (T, D) rows). An item transposes its keys once (hd, L), so that a score is a broadcast
 * query value times 8 keys (no horizontal sums), and packs its value rows (L, hd) contiguous;
 * four queries share each key load; the softmax is exact two-pass float32. Items run longest
 * first on torch's OpenMP pool (the library binds to the libgomp torch loaded).
 * Without AVX2 and FMA, or a head dim that is not a multiple of 8 up to 128, varlen_attention()
 * returns 2 and the caller keeps its torch path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

#if defined(__AVX2__) && defined(__FMA__)
enum { QB = 4, MAX_C = 16 }; /* queries per score tile; head dim at most 8 * MAX_C */

/* Scores of queries q[0..QB-1] against all Lp keys (kt is (hd, Lp), Lp a multiple of 16), times
 * scale, into sc. 16 keys a step: 8 independent accumulators, enough to cover the FMA latency
 * (4 cycles on 2 pipes). */
static inline void scores(const float *const *q, const float *kt, int64_t Lp, float scale,
                          float *sc, const int C) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t j = 0; j < Lp; j += 16) {
        __m256 a[QB][2];
        for (int r = 0; r < QB; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int d = 0; d < 8 * C; d++) {
            const __m256 k0 = _mm256_loadu_ps(kt + d * Lp + j);
            const __m256 k1 = _mm256_loadu_ps(kt + d * Lp + j + 8);
            for (int r = 0; r < QB; r++) {
                const __m256 x = _mm256_broadcast_ss(q[r] + d);
                a[r][0] = _mm256_fmadd_ps(x, k0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(x, k1, a[r][1]);
            }
        }
        for (int r = 0; r < QB; r++) {
            _mm256_storeu_ps(sc + r * Lp + j, _mm256_mul_ps(a[r][0], s));
            _mm256_storeu_ps(sc + r * Lp + j + 8, _mm256_mul_ps(a[r][1], s));
        }
    }
}

/* Row sc[0..L-1] -> e^(s - max) in place (lanes L..Lp-1 -> 0); returns 1 / their sum. */
static inline float softmax_row(float *sc, int64_t L, int64_t Lp) {
    for (int64_t j = L; j < Lp; j++) sc[j] = -INFINITY;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < Lp; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(sc + j));
    const __m256 mx = _mm256_set1_ps(hmax8(m));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < Lp; j += 8) {
        const __m256 e = exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mx));
        _mm256_storeu_ps(sc + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    for (int64_t j = L; j < Lp; j++) sc[j] = 0.0f;
    return 1.0f / hsum8(sum);
}

/* out rows o[0..1] = sum_j p[r][j] v_j * inv[r] + bv (v_j: the value rows, `stride` apart; the
 * weights sum to 1 after inv, so the value bias is added once). */
static inline void weighted_values(const float *p0, const float *p1, const float *v,
                                   const float *bv, int64_t stride, int64_t L, float inv0,
                                   float inv1, float *o0, float *o1, const int C) {
    __m256 a0[MAX_C], a1[MAX_C];
    for (int c = 0; c < C; c++) a0[c] = a1[c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < L; j++) {
        const float *vj = v + j * stride;
        const __m256 w0 = _mm256_broadcast_ss(p0 + j), w1 = _mm256_broadcast_ss(p1 + j);
        for (int c = 0; c < C; c++) {
            const __m256 x = _mm256_loadu_ps(vj + 8 * c);
            a0[c] = _mm256_fmadd_ps(w0, x, a0[c]);
            a1[c] = _mm256_fmadd_ps(w1, x, a1[c]);
        }
    }
    const __m256 i0 = _mm256_set1_ps(inv0), i1 = _mm256_set1_ps(inv1);
    for (int c = 0; c < C; c++) {
        const __m256 b = _mm256_loadu_ps(bv + 8 * c);
        _mm256_storeu_ps(o0 + 8 * c, _mm256_fmadd_ps(a0[c], i0, b));
        if (o1) _mm256_storeu_ps(o1 + 8 * c, _mm256_fmadd_ps(a1[c], i1, b));
    }
}

/* One head of one sequence of L tokens whose q/k/v rows start at `base` (row stride `stride`,
 * k and v `D` and `2 D` floats after q; `bias` their biases, laid out alike); its context rows
 * start at `out` (row stride D). kt: (2 hd Lp) scratch (keys transposed, values packed),
 * sc: (QB, Lp) scratch. */
static inline __attribute__((always_inline)) void attend(const float *base, const float *bias,
                                                         int64_t stride, int64_t D, int64_t L,
                                                         float scale, float *out, float *kt,
                                                         float *sc, const int C) {
    const int64_t hd = 8 * C, Lp = (L + 15) & ~(int64_t)15;
    for (int64_t j = 0; j < L; j++)
        for (int64_t d = 0; d < hd; d++) kt[d * Lp + j] = base[j * stride + D + d] + bias[D + d];
    for (int64_t d = 0; d < hd; d++)
        for (int64_t j = L; j < Lp; j++) kt[d * Lp + j] = 0.0f;
    /* the head's value rows, contiguous: in place they lie 3D floats apart (4.5 KiB at D = 384,
     * a page each), and every query pair sweeps all of them (TLB misses) */
    float *vp = kt + hd * Lp;
    for (int64_t j = 0; j < L; j++)
        memcpy(vp + j * hd, base + j * stride + 2 * D, hd * sizeof(float));
    float inv[QB], qb[QB][8 * MAX_C];
    for (int64_t i0 = 0; i0 < L; i0 += QB) {
        const int nq = L - i0 < QB ? (int)(L - i0) : QB;
        const float *q[QB];
        for (int r = 0; r < QB; r++) {
            const float *row = base + (i0 + (r < nq ? r : 0)) * stride;
            for (int64_t d = 0; d < hd; d++) qb[r][d] = row[d] + bias[d];
            q[r] = qb[r];
        }
        scores(q, kt, Lp, scale, sc, C);
        for (int r = 0; r < nq; r++) inv[r] = softmax_row(sc + r * Lp, L, Lp);
        for (int r = 0; r < nq; r += 2) {
            const int two = r + 1 < nq;
            weighted_values(sc + r * Lp, sc + (r + two) * Lp, vp, bias + 2 * D, hd, L, inv[r],
                            inv[r + two], out + (i0 + r) * D,
                            two ? out + (i0 + r + 1) * D : 0, C);
        }
    }
}

/* attend() with its head dim a constant where it is a common one (the loops unroll). */
static void attend_any(const float *base, const float *bias, int64_t stride, int64_t D,
                       int64_t L, float scale, float *out, float *kt, float *sc, const int C) {
    switch (C) {
    case 4: attend(base, bias, stride, D, L, scale, out, kt, sc, 4); break;
    case 8: attend(base, bias, stride, D, L, scale, out, kt, sc, 8); break;
    default: attend(base, bias, stride, D, L, scale, out, kt, sc, C);
    }
}

static void run(const float *qkv, const float *bias, const int64_t *cu, int64_t B, int64_t nh,
                int64_t hd, float scale, float *out, int nthreads) {
    const int64_t D = nh * hd, stride = 3 * D, C = hd / 8;
    int64_t max_len = 0;
    for (int64_t b = 0; b < B; b++)
        if (cu[b + 1] - cu[b] > max_len) max_len = cu[b + 1] - cu[b];
    const int64_t Lp = (max_len + 15) & ~(int64_t)15;
    /* items longest first: batches come sorted by length, so walk the sequences backwards */
    int64_t *order = malloc(sizeof(int64_t) * B);
    for (int64_t b = 0; b < B; b++) order[b] = b;
    for (int64_t b = 1; b < B; b++) { /* insertion sort by length, descending (mostly sorted) */
        const int64_t x = order[b], lx = cu[x + 1] - cu[x];
        int64_t i = b - 1;
        while (i >= 0 && cu[order[i] + 1] - cu[order[i]] < lx) order[i + 1] = order[i], i--;
        order[i + 1] = x;
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *kt = aligned_alloc(32, sizeof(float) * (2 * hd * Lp + QB * Lp + 8));
        float *sc = kt + 2 * hd * Lp; /* after kt (hd, Lp) and the packed values (Lp, hd) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * nh; it++) {
            const int64_t b = order[it / nh], h = it % nh, L = cu[b + 1] - cu[b];
            attend_any(qkv + cu[b] * stride + h * hd, bias + h * hd, stride, D, L, scale,
                       out + cu[b] * D + h * hd, kt, sc, (int)C);
        }
        free(kt);
    }
    free(order);
}
#endif

/* qkv (T, 3 nh hd) float32 before its bias, bias (3 nh hd), cu (B + 1) token offsets,
 * out (T, nh hd) float32. Returns 0, or 2 when this build or head dim is not supported
 * (nothing written). */
int varlen_attention(const float *qkv, const float *bias, const int64_t *cu, int64_t B,
                     int64_t nh, int64_t hd, float scale, float *out, int nthreads) {
#if defined(__AVX2__) && defined(__FMA__)
    if (hd % 8 != 0 || hd > 8 * MAX_C) return 2;
    run(qkv, bias, cu, B, nh, hd, scale, out, nthreads);
    return 0;
#else
    (void)qkv, (void)bias, (void)cu, (void)B, (void)nh, (void)hd, (void)scale, (void)out;
    (void)nthreads;
    return 2;
#endif
}
