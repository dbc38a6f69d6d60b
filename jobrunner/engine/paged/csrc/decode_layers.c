/* A decode step's decoder layers in one call: for each layer the kernels model.PagedCausalLM
 * runs from Python for a bfloat16 model with float32 activations, in the same order on the same
 * rows (the same bits), without returning to Python between them. From Python a layer is eight
 * calls, each converting its arguments and allocating its output; a step of 64 rows spent
 * about a tenth of its time there while the second thread waited (native_layers.py).
 *
 * Per layer, h (T, H) float32, updated in place:
 *   x = rms_norm(h) as bfloat16 rows; qkv = x Wqkv^T + b; q and k rotated, K and V written to
 *   their slots; attention of q, read in place from the qkv rows, over the cache;
 *   h += att Wo^T + b;
 *   x = rms_norm(h) as bfloat16 rows; g = silu(x Wg^T) * (x Wu^T) as bfloat16; h += g Wd^T + b.
 * Every step of that runs on all the threads: a serial copy of q and a rotation on one thread
 * (rope_kv_write took 64 rows or fewer alone) left the second thread waiting 100-150 us a layer
 * in (b)'s 64-row steps (`perf` at 20 kHz), about 4 ms of a 62 ms step.
 */
#include <stdint.h>
#include <stdlib.h>

#include "layer_kernels.h"

/* One layer's row of the table: the addresses of its weights (packed for the linears), float32
 * biases (0: none), norm weights and K/V caches. */
enum { LN1, QKV, QKV_BIAS, O, O_BIAS, LN2, GATE_UP, GATE_UP_BIAS, DOWN, DOWN_BIAS, K_CACHE,
       V_CACHE, LAYER_PTRS };

enum { DONE, NO_MEMORY, DECLINED }; /* DECLINED: a kernel did not take the step (a caller's bug) */

static int gemm_rc(int rc) { return rc == 0 ? DONE : rc == 3 ? DECLINED : NO_MEMORY; }

/* What every layer of the step shares: its rows' shapes and scratch, and where they attend. */
typedef struct {
    int64_t T, H, nh, nkv, hd, n;
    float *qkv, *att; /* (T, (nh + 2 nkv) hd), (T, nh hd) */
    uint16_t *x, *gated;  /* (T, H), (T, n) bfloat16 */
    const float *cos, *sin;
    const int64_t *positions, *slots, *tables, *ctx_lens;
    int64_t table_stride, num_blocks, bs;
    float scale;
    int cache_dtype, threads;
} Step;

#define PTR(type, l, i) ((type *)(intptr_t)(l)[i])

static int attention(const int64_t *l, float eps, float *h, const Step *s) {
    const int64_t T = s->T, H = s->H, qd = s->nh * s->hd, row = qd + 2 * s->nkv * s->hd;
    void *k = PTR(void, l, K_CACHE), *v = PTR(void, l, V_CACHE);
    if (rms_norm_bf16(h, H, PTR(float, l, LN1), eps, s->x, T, H, s->threads)) return DECLINED;
    int rc = small_gemm_bf16_rows(s->x, H, PTR(uint16_t, l, QKV), PTR(float, l, QKV_BIAS), s->qkv,
                                  T, row, H, s->threads);
    if (rc) return gemm_rc(rc);
    if (rope_kv_write(s->qkv, T, row, s->nh, s->nkv, s->hd, s->cos, s->sin, s->positions, k, v,
                      s->cache_dtype, s->slots, s->num_blocks * s->bs, s->threads))
        return DECLINED;
    if (paged_decode_ld(s->qkv, row, k, v, 0, 0, s->cache_dtype, s->tables, s->table_stride,
                        s->ctx_lens, T, s->nh, s->nkv, s->hd, s->num_blocks, s->bs, s->scale,
                        s->att, s->threads))
        return NO_MEMORY;
    return gemm_rc(small_gemm_bf16_add(s->att, qd, 0, PTR(uint16_t, l, O), PTR(float, l, O_BIAS),
                                       h, H, T, H, qd, s->threads));
}

static int mlp(const int64_t *l, float eps, float *h, const Step *s) {
    const int64_t T = s->T, H = s->H, n = s->n;
    if (rms_norm_bf16(h, H, PTR(float, l, LN2), eps, s->x, T, H, s->threads)) return DECLINED;
    int rc = small_gemm_bf16_silu(s->x, H, 1, PTR(uint16_t, l, GATE_UP),
                                  PTR(float, l, GATE_UP_BIAS), s->gated, T, 2 * n, H, s->threads);
    if (rc) return gemm_rc(rc);
    return gemm_rc(small_gemm_bf16_add(s->gated, n, 1, PTR(uint16_t, l, DOWN),
                                       PTR(float, l, DOWN_BIAS), h, H, T, H, n, s->threads));
}

/* layers: (L, LAYER_PTRS) addresses; eps: (L, 2) the two norms' epsilons; h: (T, H) float32;
 * positions, slots: (T,); tables: (T, table_stride) block ids; ctx_lens: (T,); caches of
 * cache_dtype (rope.c: float32 or bfloat16), (nkv, num_blocks, bs, hd) each. Returns DONE,
 * NO_MEMORY, or DECLINED; h and the caches are then partly updated. */
int decode_layers(const int64_t *layers, const float *eps, int64_t L, float *h, int64_t T,
                  int64_t H, int64_t nh, int64_t nkv, int64_t hd, int64_t n,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  const int64_t *slots, int cache_dtype, const int64_t *tables,
                  int64_t table_stride, const int64_t *ctx_lens, int64_t num_blocks, int64_t bs,
                  float scale, int threads) {
    const int64_t qd = nh * hd, row = qd + 2 * nkv * hd;
    float *f = malloc(sizeof(float) * (size_t)(T * (row + qd)));
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(T * (H + n)));
    int rc = f && b ? DONE : NO_MEMORY;
    if (rc == DONE) {
        const Step s = {T, H, nh, nkv, hd, n, f, f + T * row, b, b + T * H,
                        cos_table, sin_table, positions, slots, tables, ctx_lens, table_stride,
                        num_blocks, bs, scale, cache_dtype, threads};
        for (int64_t i = 0; i < L && rc == DONE; i++) {
            const int64_t *l = layers + i * LAYER_PTRS;
            rc = attention(l, eps[2 * i], h, &s);
            if (rc == DONE) rc = mlp(l, eps[2 * i + 1], h, &s);
        }
    }
    free(f);
    free(b);
    return rc;
}
