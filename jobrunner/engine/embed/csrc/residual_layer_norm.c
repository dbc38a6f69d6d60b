/* out = LayerNorm(y + bias + residual) * gamma + beta over (rows, D) float32: BERT's
 * "dense output + residual, then LayerNorm" in one pass over the rows, after a GEMM that wrote
 * y without its bias. out may be residual (in place: a row is read before it is written).
 * Mean and variance are two-pass over the row in float32, as torch's CPU LayerNorm computes them.
 * Without AVX2 and FMA, or D not a multiple of 8 (or above MAX_D), it returns 2, nothing written.
 */
#include <math.h>
#include <stdint.h>

#include "vmath.h"

enum { MAX_D = 4096 };

#if defined(__AVX2__) && defined(__FMA__)
static void row(const float *y, const float *bias, const float *res, const float *gamma,
                const float *beta, float eps, float *out, int64_t D) {
    float x[MAX_D] __attribute__((aligned(32)));
    __m256 s = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) {
        const __m256 yb = _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_loadu_ps(bias + j));
        const __m256 v = _mm256_add_ps(yb, _mm256_loadu_ps(res + j));
        _mm256_store_ps(x + j, v);
        s = _mm256_add_ps(s, v);
    }
    const __m256 mean = _mm256_set1_ps(hsum8(s) / (float)D);
    __m256 q = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_load_ps(x + j), mean);
        q = _mm256_fmadd_ps(d, d, q);
    }
    const __m256 rstd = _mm256_set1_ps(1.0f / sqrtf(hsum8(q) / (float)D + eps));
    for (int64_t j = 0; j < D; j += 8) {
        const __m256 n = _mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(x + j), mean), rstd);
        const __m256 g = _mm256_loadu_ps(gamma + j), b = _mm256_loadu_ps(beta + j);
        _mm256_storeu_ps(out + j, _mm256_fmadd_ps(n, g, b));
    }
}
#endif

int residual_layer_norm(const float *y, const float *bias, const float *res, const float *gamma,
                        const float *beta, float eps, float *out, int64_t rows, int64_t D,
                        int nthreads) {
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 != 0 || D > MAX_D) return 2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        row(y + i * D, bias, res + i * D, gamma, beta, eps, out + i * D, D);
    return 0;
#else
    (void)y, (void)bias, (void)res, (void)gamma, (void)beta, (void)eps, (void)out, (void)rows;
    (void)D, (void)nthreads;
    return 2;
#endif
}
