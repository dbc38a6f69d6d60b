/* Rotary position embedding in place, float32, bit-identical to HF's
 * `x * cos + rotate_half(x) * sin`: each product rounded, then the sum (no FMA contraction).
 *
 * rope_inplace: x (T, H, hd) with row stride `row_stride` (floats) and head stride hd;
 * cos/sin: (max_len, hd).
 *
 * rope_kv_write: the same rotation of a step's fused q/k/v projection (float32 rows of
 * nh + 2 nkv heads) and its new K/V rows into the paged cache, in one pass. Per token: its q
 * and k heads rotated in place; then its k and v heads stored to its slot of a float32 or
 * bfloat16 cache, bfloat16 rounded to nearest even as torch's `.to(torch.bfloat16)` rounds
 * (subnormals kept, NaN as 0xFFFF). The same bits as rope_inplace() and then kv_write() of the
 * converted rows, in one pass over rows still in L1 instead of four (the rotation, two
 * conversions, the copy) and without the converted temporaries: 8,192 tokens of SmolLM2's
 * heads into a bfloat16 cache, 2 threads of an AMX Xeon, 2.64 -> 1.57 ms.
 */
#include <stdint.h>
#include <string.h>

#include "kv_load.h"
#include "layer_kernels.h"

#pragma GCC optimize("fp-contract=off")

static inline void rotate(float *v, const float *c, const float *s, int64_t half) {
    for (int64_t i = 0; i < half; i++) {
        const float x1 = v[i], x2 = v[i + half];
        const float a1 = x1 * c[i], b1 = -x2 * s[i];
        const float a2 = x2 * c[i + half], b2 = x1 * s[i + half];
        v[i] = a1 + b1;
        v[i + half] = a2 + b2;
    }
}

void rope_inplace(float *x, int64_t T, int64_t H, int64_t hd, int64_t row_stride,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  int threads) {
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_table + positions[t] * hd, *s = sin_table + positions[t] * hd;
        for (int64_t h = 0; h < H; h++) rotate(x + t * row_stride + h * hd, c, s, hd / 2);
    }
}

/* float32 -> bfloat16 as torch converts: to nearest even, NaN as 0xFFFF. */
static inline void to_bf16(const float *x, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        const uint16_t r = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        dst[i] = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0xFFFFu : r;
    }
}

static inline void store_row(const float *x, void *cache, int dtype, int64_t at, int64_t hd) {
    if (dtype == BF16)
        to_bf16(x, (uint16_t *)cache + at, hd);
    else
        memcpy((float *)cache + at, x, (size_t)hd * sizeof(float));
}

/* qkv: (T, nh + 2 nkv, hd) with row stride `row` floats; cos/sin: (max_len, hd); caches:
 * (nkv, slots_per_head, hd) of `dtype` (F32 or BF16). Returns 0, or 2 for another dtype (the
 * caller then rotates and writes as before). */
int rope_kv_write(float *qkv, int64_t T, int64_t row, int64_t nh, int64_t nkv, int64_t hd,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  void *k_cache, void *v_cache, int dtype, const int64_t *slots,
                  int64_t slots_per_head, int threads) {
    if (dtype != F32 && dtype != BF16) return 2;
    /* a decode step's rows too (decode_layers.c): this pass and a copy of q on one thread took
     * 100-150 us of each layer of a 64-row step while the other thread waited */
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (T >= 16)
    for (int64_t t = 0; t < T; t++) {
        float *x = qkv + t * row;
        const float *c = cos_table + positions[t] * hd, *s = sin_table + positions[t] * hd;
        for (int64_t h = 0; h < nh + nkv; h++) rotate(x + h * hd, c, s, hd / 2);
        for (int64_t h = 0; h < nkv; h++) {
            const int64_t at = (h * slots_per_head + slots[t]) * hd;
            store_row(x + (nh + h) * hd, k_cache, dtype, at, hd);
            store_row(x + (nh + nkv + h) * hd, v_cache, dtype, at, hd);
        }
    }
    return 0;
}
