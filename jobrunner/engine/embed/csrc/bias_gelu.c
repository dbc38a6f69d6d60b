/* x = gelu(x + bias) in place over (rows, cols) float32, exact (erf) GELU as BERT uses it: the
 * bias add that addmm would copy in and the activation are one pass over the (T, 4D) rows.
 * erf is torch's own vectorised formula (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7), so the
 * values match torch's GELU to rounding. Without AVX2 and FMA, bias_gelu() returns 2 (nothing
 * written) and the caller keeps torch's ops.
 */
#include <stdint.h>

#include "vmath.h"

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 erf8(__m256 x) {
    const __m256 neg_zero = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_and_ps(neg_zero, x), a = _mm256_xor_ps(sign, x);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
    const __m256 e = exp_neg8(_mm256_xor_ps(neg_zero, _mm256_mul_ps(x, x))); /* e^(-x^2) */
    const __m256 y = _mm256_fnmadd_ps(_mm256_mul_ps(e, t), r, one); /* 1 - r t e^(-x^2) */
    return _mm256_xor_ps(sign, y);
}

static inline __m256 gelu8(__m256 x) {
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(x, half), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}
#endif

int bias_gelu(float *x, const float *bias, int64_t rows, int64_t cols, int nthreads) {
#if defined(__AVX2__) && defined(__FMA__)
    if (cols % 8 != 0) return 2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t i = 0; i < rows; i++) {
        float *row = x + i * cols;
        for (int64_t j = 0; j < cols; j += 8)
            _mm256_storeu_ps(row + j, gelu8(_mm256_add_ps(_mm256_loadu_ps(row + j),
                                                          _mm256_loadu_ps(bias + j))));
    }
    return 0;
#else
    (void)x, (void)bias, (void)rows, (void)cols, (void)nthreads;
    return 2;
#endif
}
