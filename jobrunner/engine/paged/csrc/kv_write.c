/* New K and V rows into their slots of the paged cache, for CPUs.
 *
 * Cache: (nkv, slots_per_head, hd) contiguous (a (nkv, num_blocks, block_size, hd) layer cache);
 * k, v: (T, nkv, hd) with any row and head strides (in elements) and contiguous head_dim, as
 * sliced from a fused qkv projection. Any element size: the rows are copied as bytes.
 */
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
