/* Rotary position embedding in place, float32, bit-identical to HF's
 * `x * cos + rotate_half(x) * sin`: each product rounded, then the sum (no FMA contraction).
 *
 * x: (T, H, hd) with row stride `row_stride` (floats) and head stride hd; cos/sin: (max_len, hd).
 */
#include <stdint.h>

#pragma GCC optimize("fp-contract=off")

void rope_inplace(float *x, int64_t T, int64_t H, int64_t hd, int64_t row_stride,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  int threads) {
    const int64_t half = hd / 2;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_table + positions[t] * hd, *s = sin_table + positions[t] * hd;
        for (int64_t h = 0; h < H; h++) {
            float *v = x + t * row_stride + h * hd;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = v[i], x2 = v[i + half];
                const float a1 = x1 * c[i], b1 = -x2 * s[i];
                const float a2 = x2 * c[i + half], b2 = x1 * s[i + half];
                v[i] = a1 + b1;
                v[i + half] = a2 + b2;
            }
        }
    }
}
