/* Decode attention straight from the paged KV cache, for CPUs.
 *
 * One query token per row; row r attends to the first ctx_lens[r] positions of its block table.
 * K and V are read in place from the cache (nkv, num_blocks, block_size, head_dim): no gather
 * copy, no padding. Work is split over (row, kv head) pairs across threads; each pair reads its
 * K/V rows once for all the query heads that share that KV head (GQA).
 *
 * Scores and outputs accumulate in float32. The cache may be float32, bfloat16 or float16.
 * Plain C: built with `cc -O3 -march=native` at first use (engine/paged/cpu_kernels.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, BF16 = 1, F16 = 2 };

typedef struct {
    const float *q;         /* (b, nh, hd) */
    const void *k, *v;      /* (nkv, num_blocks, bs, hd) */
    int dtype;
    const int64_t *tables;  /* (b, table_stride) */
    int64_t table_stride;
    const int64_t *ctx_lens; /* (b,) */
    int64_t b, nh, nkv, hd, num_blocks, bs, max_ctx;
    float scale;
    float *out;             /* (b, nh, hd) */
} Job;

/* Row `offset` of the cache as float32: in place for a float32 cache, else converted into dst. */
static inline const float *load_row(const void *base, int dtype, int64_t offset, int64_t hd,
                                    float *dst) {
    if (dtype == F32) return (const float *)base + offset;
    if (dtype == BF16) {
        const uint16_t *src = (const uint16_t *)base + offset;
        for (int64_t i = 0; i < hd; i++) {
            uint32_t bits = (uint32_t)src[i] << 16;
            memcpy(dst + i, &bits, sizeof(float));
        }
    } else {
#ifdef __FLT16_MAX__
        const _Float16 *src = (const _Float16 *)base + offset;
        for (int64_t i = 0; i < hd; i++) dst[i] = (float)src[i];
#endif
    }
    return dst;
}

/* exp for x <= 0 (softmax after subtracting the max), about 1 ulp, written to vectorize. */
static inline float exp_neg(float x) {
    if (x < -87.0f) return 0.0f;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(float));
    return p * scale;
}

static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s;
}

static void softmax_rows(float *scores, int64_t rows, int64_t L) {
    for (int64_t j = 0; j < rows; j++) {
        float *s = scores + j * L, m = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < L; t++) m = s[t] > m ? s[t] : m;
        for (int64_t t = 0; t < L; t++) {
            s[t] = exp_neg(s[t] - m);
            sum += s[t];
        }
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < L; t++) s[t] *= inv;
    }
}

#ifdef __AVX512F__
#include <immintrin.h>

static inline __m512 load16(const void *base, int dtype, int64_t offset) {
    if (dtype == F32) return _mm512_loadu_ps((const float *)base + offset);
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + offset));
    if (dtype == BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    return _mm512_cvtph_ps(half);
}

/* One (row, kv head) with G query heads and head_dim 16 * C, the q and output accumulators held
 * in registers; G and C are constants at each call site, so the loops unroll. */
static inline __attribute__((always_inline)) void item_avx512(const Job *J, int64_t r, int64_t h,
                                                              float *scores, const int G,
                                                              const int C) {
    const int64_t hd = 16 * C, L = J->ctx_lens[r], bs = J->bs;
    const float *q = J->q + (r * J->nh + h * G) * hd;
    float *o = J->out + (r * J->nh + h * G) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * bs * hd;
    __m512 acc[G][C];
    for (int j = 0; j < G; j++)
        for (int c = 0; c < C; c++) acc[j][c] = _mm512_loadu_ps(q + j * hd + 16 * c);
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / bs] * bs + t % bs) * hd;
        __m512 k[C];
        for (int c = 0; c < C; c++) k[c] = load16(J->k, J->dtype, off + 16 * c);
        for (int j = 0; j < G; j++) {
            __m512 d = _mm512_mul_ps(acc[j][0], k[0]);
            for (int c = 1; c < C; c++) d = _mm512_fmadd_ps(acc[j][c], k[c], d);
            scores[j * L + t] = _mm512_reduce_add_ps(d) * J->scale;
        }
    }
    softmax_rows(scores, G, L);
    for (int j = 0; j < G; j++)
        for (int c = 0; c < C; c++) acc[j][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / bs] * bs + t % bs) * hd;
        __m512 v[C];
        for (int c = 0; c < C; c++) v[c] = load16(J->v, J->dtype, off + 16 * c);
        for (int j = 0; j < G; j++) {
            const __m512 p = _mm512_set1_ps(scores[j * L + t]);
            for (int c = 0; c < C; c++) acc[j][c] = _mm512_fmadd_ps(p, v[c], acc[j][c]);
        }
    }
    for (int j = 0; j < G; j++)
        for (int c = 0; c < C; c++) _mm512_storeu_ps(o + j * hd + 16 * c, acc[j][c]);
}

#define ITEM_CASE(G, C) \
    case (G) * 16 + (C): item_avx512(J, r, h, scores, G, C); return 1;

/* 1 when a specialised path handled the item (head_dim 64 or 128, up to 8 heads per KV head). */
static int item_fast(const Job *J, int64_t r, int64_t h, float *scores) {
    const int64_t g = J->nh / J->nkv;
    switch (g * 16 + J->hd / 16 * (J->hd % 16 == 0)) {
        ITEM_CASE(1, 4) ITEM_CASE(2, 4) ITEM_CASE(3, 4) ITEM_CASE(4, 4)
        ITEM_CASE(5, 4) ITEM_CASE(6, 4) ITEM_CASE(7, 4) ITEM_CASE(8, 4)
        ITEM_CASE(1, 8) ITEM_CASE(2, 8) ITEM_CASE(3, 8) ITEM_CASE(4, 8)
        ITEM_CASE(5, 8) ITEM_CASE(6, 8) ITEM_CASE(7, 8) ITEM_CASE(8, 8)
    }
    return 0;
}
#else
static int item_fast(const Job *J, int64_t r, int64_t h, float *scores) { return 0; }
#endif

static void one_item(const Job *J, int64_t item, float *scores, float *row) {
    if (item_fast(J, item / J->nkv, item % J->nkv, scores)) return;
    const int64_t r = item / J->nkv, h = item % J->nkv;
    const int64_t g = J->nh / J->nkv, hd = J->hd, L = J->ctx_lens[r];
    const float *q = J->q + (r * J->nh + h * g) * hd;   /* g query heads, contiguous */
    float *o = J->out + (r * J->nh + h * g) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * J->bs * hd;
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / J->bs] * J->bs + t % J->bs) * hd;
        const float *kt = load_row(J->k, J->dtype, off, hd, row);
        for (int64_t j = 0; j < g; j++) scores[j * L + t] = dot(q + j * hd, kt, hd) * J->scale;
    }
    softmax_rows(scores, g, L);
    memset(o, 0, g * hd * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / J->bs] * J->bs + t % J->bs) * hd;
        const float *vt = load_row(J->v, J->dtype, off, hd, row);
        for (int64_t j = 0; j < g; j++) {
            const float p = scores[j * L + t];
            float *oj = o + j * hd;
            for (int64_t i = 0; i < hd; i++) oj[i] += p * vt[i];
        }
    }
}

/* Returns 0 on success. Parallel over (row, kv head) pairs with OpenMP: loaded after torch, the
 * library binds to torch's own libgomp (same soname), so it shares torch's thread pool. */
int paged_decode(const float *q, const void *k, const void *v, int dtype, const int64_t *tables,
                 int64_t table_stride, const int64_t *ctx_lens, int64_t b, int64_t nh,
                 int64_t nkv, int64_t hd, int64_t num_blocks, int64_t bs, float scale,
                 float *out, int threads) {
    int64_t max_ctx = 1;
    for (int64_t r = 0; r < b; r++) max_ctx = ctx_lens[r] > max_ctx ? ctx_lens[r] : max_ctx;
    const Job J = {q, k, v, dtype, tables, table_stride, ctx_lens, b, nh, nkv, hd,
                   num_blocks, bs, max_ctx, scale, out};
    const int64_t g = nh / nkv, items = b * nkv;
    int failed = 0;
#pragma omp parallel num_threads(threads < 1 ? 1 : threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (g * max_ctx + hd));
        if (!scores) failed = 1;
        /* longest rows first (rows come sorted by length, shortest first): dynamic balances */
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++)
            if (scores) one_item(&J, items - 1 - i, scores, scores + g * max_ctx);
        free(scores);
    }
    return failed;
}
