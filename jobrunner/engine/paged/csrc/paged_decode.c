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

#include "vexp.h"

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

/* d[0..15] -> one vector whose lane t is the sum of d[t]'s lanes (a transpose-and-add tree:
 * 45 shuffles and adds for 16 dot products instead of 16 full reductions). */
static inline __m512 hsum16(__m512 d[16]) {
    __m512 s[8], w[4];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]),
                             _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 1, 3, 1)));
    /* 128-bit lanes of x01: tokens 0-3 (sums over d's lanes 0-1, then 2-3), tokens 4-7 (same) */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Cache offsets (in elements) of tokens t0..t0+15 of one head; past L, token t0 repeats. One
 * division per chunk, not one per token. */
static inline void chunk_offsets(const int64_t *table, int64_t bs, int64_t hd, int64_t head_base,
                                 int64_t t0, int64_t L, int64_t off[16]) {
    int64_t blk = t0 / bs, pos = t0 % bs;
    const int64_t first = head_base + (table[blk] * bs + pos) * hd; /* t0 < L at every call */
    for (int64_t tt = 0; tt < 16; tt++) {
        off[tt] = t0 + tt < L ? head_base + (table[blk] * bs + pos) * hd : first;
        if (++pos == bs) pos = 0, blk++;
    }
}

/* Blocks are scattered runs of a few KiB that the hardware prefetcher does not follow, so the
 * next chunk's K and V rows are requested while this one computes: 202 -> 152 ms a step for 62
 * rows over shuffled blocks, 134 -> 124 ms over consecutive ones (microbenchmark, 30 layers). */
static inline __attribute__((always_inline)) void prefetch_rows(const Job *J, const int64_t off[16],
                                                                int64_t n, const int C) {
    const int64_t width = J->dtype == F32 ? 4 : 2;
    const char *k = (const char *)J->k, *v = (const char *)J->v;
    for (int64_t tt = 0; tt < n; tt++)
        for (int c = 0; c < C; c++) { /* a row is C * 64 bytes (float32) or half that */
            _mm_prefetch(k + (off[tt] + 16 * c) * width, _MM_HINT_T0);
            _mm_prefetch(v + (off[tt] + 16 * c) * width, _MM_HINT_T0);
        }
}

/* One (row, kv head) with G query heads and head_dim 16 * C, in one pass over the context:
 * 16 tokens at a time, their scores for each head as one vector, an online softmax (running max
 * and sum, the output rescaled when the max grows), K and V of a block read while in cache. */
static inline __attribute__((always_inline)) void item_avx512(const Job *J, int64_t r, int64_t h,
                                                              const int G, const int C) {
    const int64_t hd = 16 * C, L = J->ctx_lens[r], bs = J->bs;
    const float *q = J->q + (r * J->nh + h * G) * hd;
    float *o = J->out + (r * J->nh + h * G) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * bs * hd;
    const __m512 scale = _mm512_set1_ps(J->scale);
    __m512 acc[G][C], sum[G];
    float m[G];
    float p[G][16] __attribute__((aligned(64)));
    for (int j = 0; j < G; j++) {
        m[j] = -INFINITY;
        sum[j] = _mm512_setzero_ps();
        for (int c = 0; c < C; c++) acc[j][c] = _mm512_setzero_ps();
    }
    int64_t off[16], next[16];
    chunk_offsets(table, bs, hd, head_base, 0, L, next);
    for (int64_t t0 = 0; t0 < L; t0 += 16) {
        const int64_t nt = L - t0 < 16 ? L - t0 : 16;
        memcpy(off, next, sizeof(off));
        if (t0 + 16 < L) { /* the next chunk's rows are requested while this one computes */
            chunk_offsets(table, bs, hd, head_base, t0 + 16, L, next);
            prefetch_rows(J, next, L - t0 - 16 < 16 ? L - t0 - 16 : 16, C);
        }
        const __mmask16 live = (__mmask16)((1u << nt) - 1u);
        for (int j = 0; j < G; j++) {
            __m512 qj[C], d[16];
            for (int c = 0; c < C; c++) qj[c] = _mm512_loadu_ps(q + j * hd + 16 * c);
            for (int tt = 0; tt < 16; tt++) {
                d[tt] = _mm512_mul_ps(qj[0], load16(J->k, J->dtype, off[tt]));
                for (int c = 1; c < C; c++)
                    d[tt] = _mm512_fmadd_ps(qj[c], load16(J->k, J->dtype, off[tt] + 16 * c), d[tt]);
            }
            const __m512 s = _mm512_mul_ps(hsum16(d), scale); /* lane tt: token t0 + tt */
            const float m_new = fmaxf(m[j], _mm512_mask_reduce_max_ps(live, s));
            const __m512 e = _mm512_maskz_mov_ps(live, exp_neg16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
            const __m512 alpha = exp_neg16(_mm512_set1_ps(m[j] - m_new)); /* 1 when unchanged */
            for (int c = 0; c < C; c++) acc[j][c] = _mm512_mul_ps(acc[j][c], alpha);
            sum[j] = _mm512_fmadd_ps(sum[j], alpha, e);
            m[j] = m_new;
            _mm512_store_ps(p[j], e);
        }
        for (int64_t tt = 0; tt < nt; tt++) {
            __m512 v[C];
            for (int c = 0; c < C; c++) v[c] = load16(J->v, J->dtype, off[tt] + 16 * c);
            for (int j = 0; j < G; j++) {
                const __m512 pj = _mm512_set1_ps(p[j][tt]);
                for (int c = 0; c < C; c++) acc[j][c] = _mm512_fmadd_ps(pj, v[c], acc[j][c]);
            }
        }
    }
    for (int j = 0; j < G; j++) {
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[j]));
        for (int c = 0; c < C; c++) _mm512_storeu_ps(o + j * hd + 16 * c, _mm512_mul_ps(acc[j][c], inv));
    }
}

#define ITEM_CASE(G, C) \
    case (G) * 16 + (C): item_avx512(J, r, h, G, C); return 1;

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
