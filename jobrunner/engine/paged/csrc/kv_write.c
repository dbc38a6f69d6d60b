/* New K and V rows into their slots of the paged cache, for CPUs.
 *
 * Cache: (nkv, slots_per_head, hd) contiguous (a (nkv, num_blocks, block_size, hd) layer cache);
 * k, v: (T, nkv, hd) with any row and head strides (in elements) and contiguous head_dim, as
 * sliced from a fused qkv projection. Any element size: the rows are copied as bytes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

void kv_write(char *k_cache, char *v_cache, const char *k, const char *v, const int64_t *slots,
              int64_t T, int64_t nkv, int64_t hd, int64_t slots_per_head, int64_t elem,
              int64_t k_row, int64_t k_head, int64_t v_row, int64_t v_head, int threads) {
    const int64_t bytes = hd * elem;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (T > 256)
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nkv; h++) {
            const int64_t dst = (h * slots_per_head + slots[t]) * bytes;
            memcpy(k_cache + dst, k + (t * k_row + h * k_head) * elem, bytes);
            memcpy(v_cache + dst, v + (t * v_row + h * v_head) * elem, bytes);
        }
}

/* The same for an 8-bit cache (engine/quant/kv.py): each (token, head) row of float32 values
 * becomes 8-bit codes and one float16 scale, scale = absmax / qmax (absmax at least 1e-6) and
 * code = x / scale clamped to +-qmax, then rounded half to even: to an integer (int8, qmax 127)
 * or to e4m3 (fp8, qmax 448), exactly as QuantizedKV.write computes them in torch. Returns 1
 * where the compiler has no _Float16 (the caller then quantizes in torch). */

/* |x| <= 448 as fp8 e4m3 (fn: no inf, 0x7f is NaN), rounded half to even. */
static inline uint8_t e4m3_from_float(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof(b));
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
    b &= 0x7fffffffu;
    if (b < 0x3c800000u) { /* below 2^-6, the smallest normal: subnormal steps of 2^-9 */
        float a;
        memcpy(&a, &b, sizeof(a));
        return sign | (uint8_t)nearbyintf(a * 512.0f); /* 8 is 2^-6 itself: code 0x08 */
    }
    b += 0x7ffffu + ((b >> 20) & 1u); /* the 20 dropped mantissa bits, half to even */
    return sign | (uint8_t)((((b >> 23) - 120u) << 3) | ((b >> 20) & 7u)); /* bias 127 -> 7 */
}

static int quantize_row(const float *x, int64_t hd, int fp8, uint8_t *codes, uint16_t *scale) {
#ifdef __FLT16_MAX__
    const float qmax = fp8 ? 448.0f : 127.0f;
    float amax = 0.0f;
    for (int64_t i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float s = (amax > 1e-6f ? amax : 1e-6f) / qmax;
    for (int64_t i = 0; i < hd; i++) {
        float q = x[i] / s;
        q = q > qmax ? qmax : q < -qmax ? -qmax : q;
        codes[i] = fp8 ? e4m3_from_float(q) : (uint8_t)(int8_t)nearbyintf(q);
    }
    const _Float16 h = (_Float16)s;
    memcpy(scale, &h, sizeof(h));
    return 0;
#else
    (void)x, (void)hd, (void)fp8, (void)codes, (void)scale;
    return 1;
#endif
}

int kv_write_q8(uint8_t *k_codes, uint16_t *k_scales, uint8_t *v_codes, uint16_t *v_scales,
                const float *k, const float *v, const int64_t *slots, int64_t T, int64_t nkv,
                int64_t hd, int64_t slots_per_head, int64_t k_row, int64_t k_head, int64_t v_row,
                int64_t v_head, int fp8, int threads) {
    int failed = 0;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (T > 64) \
    reduction(| : failed)
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nkv; h++) {
            const int64_t row = h * slots_per_head + slots[t];
            failed |= quantize_row(k + t * k_row + h * k_head, hd, fp8, k_codes + row * hd,
                                   k_scales + row);
            failed |= quantize_row(v + t * v_row + h * v_head, hd, fp8, v_codes + row * hd,
                                   v_scales + row);
        }
    return failed;
}
