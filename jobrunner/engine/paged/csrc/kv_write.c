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

/* The same for an int8 cache (engine/quant/kv.py): each (token, head) row of float32 values
 * becomes int8 codes and one float16 scale, scale = absmax / 127 (at least 1e-6 / 127) and
 * code = round-half-even(x / scale), exactly as QuantizedKV.write computes them in torch.
 * Returns 1 where the compiler has no _Float16 (the caller then quantizes in torch). */
static int quantize_row(const float *x, int64_t hd, int8_t *codes, uint16_t *scale) {
#ifdef __FLT16_MAX__
    float amax = 0.0f;
    for (int64_t i = 0; i < hd; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float s = (amax > 1e-6f ? amax : 1e-6f) / 127.0f;
    for (int64_t i = 0; i < hd; i++) {
        float q = x[i] / s;
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        codes[i] = (int8_t)nearbyintf(q);
    }
    const _Float16 h = (_Float16)s;
    memcpy(scale, &h, sizeof(h));
    return 0;
#else
    (void)x, (void)hd, (void)codes, (void)scale;
    return 1;
#endif
}

int kv_write_int8(int8_t *k_codes, uint16_t *k_scales, int8_t *v_codes, uint16_t *v_scales,
                  const float *k, const float *v, const int64_t *slots, int64_t T, int64_t nkv,
                  int64_t hd, int64_t slots_per_head, int64_t k_row, int64_t k_head,
                  int64_t v_row, int64_t v_head, int threads) {
    int failed = 0;
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) if (T > 64) \
    reduction(| : failed)
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nkv; h++) {
            const int64_t row = h * slots_per_head + slots[t];
            failed |= quantize_row(k + t * k_row + h * k_head, hd, k_codes + row * hd, k_scales + row);
            failed |= quantize_row(v + t * v_row + h * v_head, hd, v_codes + row * hd, v_scales + row);
        }
    return failed;
}
