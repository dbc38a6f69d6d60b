/* A decode step's decoder layers in one call: for each layer the kernels model.PagedCausalLM
 * runs from Python, for a bfloat16 model with float32 activations or a float32 model on our
 * float32 linears, in the same order on the same rows (the same bits), without returning to
 * Python between them. From Python a layer is eight calls or more, each converting its
 * arguments and allocating its output; a step of 64 rows spent about a tenth of its time there
 * while the second thread waited (native_layers.py).
 *
 * Per layer, h (T, H) float32, updated in place:
 *   x = rms_norm(h) as bfloat16 rows; qkv = x Wqkv^T + b; q and k rotated, K and V written to
 *   their slots; attention of q, read in place from the qkv rows, over the cache;
 *   h += att Wo^T + b;
 *   x = rms_norm(h) as bfloat16 rows; g = silu(x Wg^T) * (x Wu^T) as bfloat16; h += g Wd^T + b.
 * With float32 weights the rows stay float32, each linear is written out and then added to h,
 * and silu(gate) * up is its own pass after the gate/up linear, as the Python loop runs them.
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

/* What every layer of the step shares: its rows' shapes and scratch, and where they attend.
 * Bfloat16 weights (f32 0) take their rows as bfloat16 (x, gated); float32 weights (f32 1)
 * take float32 rows (xf, g) and write their outputs (y, gu) for the adds and the product. */
typedef struct {
    int64_t T, H, nh, nkv, hd, n;
    float *qkv, *att;      /* (T, (nh + 2 nkv) hd), (T, nh hd) */
    uint16_t *x, *gated;   /* (T, H), (T, n) bfloat16 */
    float *xf, *y, *gu, *g; /* (T, H), (T, H), (T, 2n), (T, n) float32 */
    const float *cos, *sin;
    const int64_t *positions, *slots, *tables, *ctx_lens;
    int64_t table_stride, num_blocks, bs;
    float scale;
    int cache_dtype, threads, f32;
} Step;

#define PTR(type, l, i) ((type *)(intptr_t)(l)[i])

/* h += y over the step's rows: torch's `h += linear(x)`, one float32 add each. */
static void add_rows(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] += y[i];
}

/* The layer's normed rows through the linear at weight index w (with its bias, b) into out
 * (T, N): rows rounded to bfloat16 for bfloat16 weights, float32 rows for float32 ones. */
static int norm_linear(const int64_t *l, int norm, float eps, const float *h, int w, int b,
                       float *out, int64_t N, const Step *s) {
    const int64_t T = s->T, H = s->H;
    if (s->f32) {
        rms_norm(h, H, PTR(float, l, norm), eps, s->xf, T, H, s->threads);
        small_gemm(s->xf, H, PTR(float, l, w), PTR(float, l, b), out, T, N, H, s->threads);
        return DONE;
    }
    if (rms_norm_bf16(h, H, PTR(float, l, norm), eps, s->x, T, H, s->threads)) return DECLINED;
    return gemm_rc(small_gemm_bf16_rows(s->x, H, PTR(uint16_t, l, w), PTR(float, l, b), out, T,
                                        N, H, s->threads));
}

/* h += the linear at weight index w of rows x (T, K), row stride ldx: float32 rows, or (x_bf16,
 * bfloat16 weights only) bfloat16 ones. */
static int add_linear(const int64_t *l, int w, int b, const void *x, int64_t ldx, int x_bf16,
                      int64_t K, float *h, const Step *s) {
    const int64_t T = s->T, H = s->H;
    if (s->f32) {
        small_gemm(x, ldx, PTR(float, l, w), PTR(float, l, b), s->y, T, H, K, s->threads);
        add_rows(h, s->y, T * H);
        return DONE;
    }
    return gemm_rc(small_gemm_bf16_add(x, ldx, x_bf16, PTR(uint16_t, l, w), PTR(float, l, b), h,
                                       H, T, H, K, s->threads));
}

static int attention(const int64_t *l, float eps, float *h, const Step *s) {
    const int64_t T = s->T, qd = s->nh * s->hd, row = qd + 2 * s->nkv * s->hd;
    void *k = PTR(void, l, K_CACHE), *v = PTR(void, l, V_CACHE);
    int rc = norm_linear(l, LN1, eps, h, QKV, QKV_BIAS, s->qkv, row, s);
    if (rc) return rc;
    if (rope_kv_write(s->qkv, T, row, s->nh, s->nkv, s->hd, s->cos, s->sin, s->positions, k, v,
                      s->cache_dtype, s->slots, s->num_blocks * s->bs, s->threads))
        return DECLINED;
    if (paged_decode_ld(s->qkv, row, k, v, 0, 0, s->cache_dtype, s->tables, s->table_stride,
                        s->ctx_lens, T, s->nh, s->nkv, s->hd, s->num_blocks, s->bs, s->scale,
                        s->att, s->threads))
        return NO_MEMORY;
    return add_linear(l, O, O_BIAS, s->att, qd, 0, qd, h, s);
}

static int mlp(const int64_t *l, float eps, float *h, const Step *s) {
    const int64_t T = s->T, H = s->H, n = s->n;
    if (s->f32) { /* the gate/up linear, then silu(gate) * up, as the Python loop runs them */
        int rc = norm_linear(l, LN2, eps, h, GATE_UP, GATE_UP_BIAS, s->gu, 2 * n, s);
        if (rc) return rc;
        silu_mul(s->gu, 2 * n, s->g, T, n, s->threads);
        return add_linear(l, DOWN, DOWN_BIAS, s->g, n, 0, n, h, s);
    }
    if (rms_norm_bf16(h, H, PTR(float, l, LN2), eps, s->x, T, H, s->threads)) return DECLINED;
    int rc = small_gemm_bf16_silu(s->x, H, 1, PTR(uint16_t, l, GATE_UP),
                                  PTR(float, l, GATE_UP_BIAS), s->gated, T, 2 * n, H, s->threads);
    if (rc) return gemm_rc(rc);
    return add_linear(l, DOWN, DOWN_BIAS, s->gated, n, 1, n, h, s);
}

/* layers: (L, LAYER_PTRS) addresses; eps: (L, 2) the two norms' epsilons; h: (T, H) float32;
 * positions, slots: (T,); tables: (T, table_stride) block ids; ctx_lens: (T,); caches of
 * cache_dtype (rope.c: float32 or bfloat16), (nkv, num_blocks, bs, hd) each; f32: the linears'
 * weights are float32 packed for small_gemm.c (else bfloat16 packed for small_gemm_bf16.c).
 * Returns DONE, NO_MEMORY, or DECLINED; h and the caches are then partly updated. */
int decode_layers(const int64_t *layers, const float *eps, int64_t L, float *h, int64_t T,
                  int64_t H, int64_t nh, int64_t nkv, int64_t hd, int64_t n,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  const int64_t *slots, int cache_dtype, const int64_t *tables,
                  int64_t table_stride, const int64_t *ctx_lens, int64_t num_blocks, int64_t bs,
                  float scale, int threads, int f32) {
    const int64_t qd = nh * hd, row = qd + 2 * nkv * hd;
    const int64_t floats = T * (row + qd + (f32 ? 2 * H + 3 * n : 0));
    float *f = malloc(sizeof(float) * (size_t)floats);
    uint16_t *b = f32 ? 0 : malloc(sizeof(uint16_t) * (size_t)(T * (H + n)));
    int rc = f && (f32 || b) ? DONE : NO_MEMORY;
    if (rc == DONE) {
        float *xf = f32 ? f + T * (row + qd) : 0; /* float32 weights' scratch, after att */
        float *y = f32 ? xf + T * H : 0, *gu = f32 ? y + T * H : 0, *g = f32 ? gu + 2 * T * n : 0;
        const Step s = {T, H, nh, nkv, hd, n, f, f + T * row, b, b ? b + T * H : 0, xf, y, gu, g,
                        cos_table, sin_table, positions, slots, tables, ctx_lens, table_stride,
                        num_blocks, bs, scale, cache_dtype, threads, f32};
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
