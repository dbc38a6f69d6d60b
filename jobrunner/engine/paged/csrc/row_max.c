/* Greedy sampling's argmax over a step's logits: for each row, the index of the first value
 * equal to its maximum (torch.amax's, computed before), or of its first NaN where the maximum
 * is NaN: torch.max(dim=-1)'s index. torch's own reduction carries an index through every
 * element (1.4-2.3 ms for 64 rows of a 49,152-token vocabulary, 2 Zen 4 threads); the max
 * alone is vectorized, and so is this search, a block of compares at a time. */
#include <stdint.h>

#define BLOCK 256

static int64_t first_of(const float *x, int64_t V, float best) {
    const int nan = best != best;
    for (int64_t i0 = 0; i0 < V; i0 += BLOCK) {
        const float *p = x + i0;
        const int64_t n = V - i0 < BLOCK ? V - i0 : BLOCK;
        int hit = 0;
        if (nan)
            for (int64_t i = 0; i < n; i++) hit |= p[i] != p[i];
        else
            for (int64_t i = 0; i < n; i++) hit |= p[i] == best;
        if (hit)
            for (int64_t i = 0; i < n; i++)
                if (nan ? p[i] != p[i] : p[i] == best) return i0 + i;
    }
    return -1; /* best is not in the row */
}

/* x: (T, V) float32, row stride ld; best: (T,) each row's maximum; out: (T,) int64. */
void row_first_index(const float *x, int64_t ld, const float *best, int64_t T, int64_t V,
                     int64_t *out, int threads) {
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; t++) out[t] = first_of(x + t * ld, V, best[t]);
}
