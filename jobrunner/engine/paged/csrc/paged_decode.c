/* Decode attention straight from the paged KV cache, for CPUs.
 *
 * One query token per row; row r attends to the first ctx_lens[r] positions of its block table.
 * K and V are read in place from the cache (nkv, num_blocks, block_size, head_dim): no gather
 * copy, no padding. Work is split over (row, kv head) pairs across threads; each pair reads its
 * K/V rows once for all the query heads that share that KV head (GQA).
 *
 * Scores and outputs accumulate in float32. The cache may be float32, bfloat16 or float16, or
 * 8-bit codes (int8, or fp8 e4m3) with one float16 scale per (KV head, token) row
 * (engine/quant/kv.py): a row's value is its codes times its scale.
 * Plain C: built with `cc -O3 -march=native` at first use (engine/paged/cpu_kernels.py).
 * AVX-512 and AVX2 have specialised paths (head_dim 64 or 128, up to 8 heads per KV head); on
 * NEON the plain path runs with vector helpers (decode_neon.h). Over a bfloat16 cache on
 * AVX-512 BF16 both products run on vdpbf16ps: the queries rounded to bfloat16 pairs of dims
 * against K rows read as they are, the softmax weights rounded to pairs of tokens against V rows
 * interleaved two at a time; scores, sums and outputs stay float32 (Zen 4, SmolLM2's heads, 2
 * threads, 16 rows of 300 tokens from memory: 0.45 -> 0.28 ms a layer; bench (b)'s decode steps
 * 8.3 -> 5.7 s of CPU).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "head_cases.h"
#include "kv_load.h"
#include "layer_kernels.h"
#include "vexp.h"

typedef struct {
    const float *q;         /* (b, nh, hd), row stride ldq floats */
    int64_t ldq;
    const void *k, *v;      /* (nkv, num_blocks, bs, hd) */
    const uint16_t *k_scale, *v_scale; /* (nkv, num_blocks, bs) float16 for I8 / FP8, else NULL */
    int dtype;
    const int64_t *tables;  /* (b, table_stride) */
    int64_t table_stride;
    const int64_t *ctx_lens; /* (b,) */
    int64_t b, nh, nkv, hd, num_blocks, bs, max_ctx;
    float scale;
    float *out;             /* (b, nh, hd) */
} Job;

#if defined(JR_NEON)
#include "decode_neon.h" /* load_row_neon, dot, softmax_rows and v_pass_neon on NEON vectors */

static inline const float *load_row(const Job *J, const void *base, const uint16_t *scales,
                                    int64_t offset, float *dst) {
    return load_row_neon(J->dtype, base, scales, offset, J->hd, dst);
}
#else
/* Row `offset` of the cache as float32: in place for a float32 cache, else converted into dst
 * (quantized rows times their scale, which sits at offset / hd). */
static inline const float *load_row(const Job *J, const void *base, const uint16_t *scales,
                                    int64_t offset, float *dst) {
    const int64_t hd = J->hd;
    switch (J->dtype) {
    case F32:
        return (const float *)base + offset;
    case BF16:
        for (int64_t i = 0; i < hd; i++) {
            uint32_t bits = (uint32_t)((const uint16_t *)base)[offset + i] << 16;
            memcpy(dst + i, &bits, sizeof(float));
        }
        break;
    case F16:
        for (int64_t i = 0; i < hd; i++)
            dst[i] = half_to_float(((const uint16_t *)base)[offset + i]);
        break;
    case I8: {
        const float s = code_scale(I8, scales, offset, hd);
        for (int64_t i = 0; i < hd; i++) dst[i] = (float)((const int8_t *)base)[offset + i] * s;
        break;
    }
    default: {
        const float s = code_scale(FP8, scales, offset, hd);
        for (int64_t i = 0; i < hd; i++)
            dst[i] = half_to_float(fp8_as_half(((const uint8_t *)base)[offset + i])) * s;
    }
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
#endif

#if defined(JR_AVX512) || defined(JR_AVX2)

enum { SPAN = 64 }; /* tokens per online-softmax update */

/* Cache offsets (in elements) of tokens t0..t0+n-1 of one head (one division per call). */
static inline void span_offsets(const int64_t *table, int64_t bs, int64_t hd, int64_t head_base,
                                int64_t t0, int64_t n, int64_t *off) {
    int64_t blk = t0 / bs, pos = t0 % bs;
    for (int64_t tt = 0; tt < n; tt++) {
        off[tt] = head_base + (table[blk] * bs + pos) * hd;
        if (++pos == bs) pos = 0, blk++;
    }
}

/* Blocks are scattered runs of a few KiB that the hardware prefetcher does not follow, so K and
 * V rows are requested a span ahead: the next span's K rows while this span's scores are
 * computed, its V rows while this span's V rows are summed, so each arrives a whole span before
 * it is read; after an item's last span, the first span of the item its thread works on next.
 * Only a thread's first item fetches within its first span, 16 tokens ahead of the scores.
 * Before, every span fetched 16 tokens ahead during its score pass only, and memory sat idle
 * through the V pass: 52 rows of 540 tokens, 30 layers, float32, 2 cores, 85 -> 78 ms a step on
 * 4 KiB pages. Then both rows of the next span were requested in the V pass, which left the K
 * rows only the rest of that pass (Zen 4, 2 threads, bfloat16 cache, blocks in order as the
 * engine's mostly are, medians of 5-7 runs: 64 rows x 600 tokens over 30 layers' caches 48.1 ->
 * 38.9 ms, 256 x 300 over 6 21.0 -> 17.9, 16 x 2,000 over 12 16.9 -> 13.7; blocks in random
 * order 65.6 -> 62.5; all of the next span's rows during the score pass: 46.3, 73.5).
 * Inlined on purpose: as a call it overlapped nothing (84 against 67 ms a step). The lines go to
 * L2 (T1), not L1 (T0): a span ahead is 16 KB of a 32 KB L1 on a bfloat16 cache, and the L1's
 * few miss buffers then held up the loads of the span being read (Zen 4, 2 threads, 256 rows of
 * 300 tokens over 6 layers' caches: 29 -> 24 ms, 12 -> 15 GB/s; float16 the same; no change on
 * the AVX2 path, which is compute-bound on a 16-bit cache). Requesting the next item a whole
 * item ahead instead, or 32- or 128-token spans, did no better. */
static inline __attribute__((always_inline)) void prefetch_row(const Job *J, const void *base,
                                                               int64_t off) {
    const int64_t width = elem_bytes(J->dtype), lines = (J->hd * width + 63) / 64;
    for (int64_t c = 0; c < lines; c++)
        _mm_prefetch((const char *)base + off * width + 64 * c, _MM_HINT_T1);
}

/* The K and V rows at off[0..n-1]. */
static inline __attribute__((always_inline)) void prefetch_rows(const Job *J, const int64_t *off,
                                                                int64_t n) {
    for (int64_t tt = 0; tt < n; tt++) {
        prefetch_row(J, J->k, off[tt]);
        prefetch_row(J, J->v, off[tt]);
    }
}

/* After an item's span of n tokens, when the next span (next, nn tokens) is longer: the rows the
 * passes over this span did not request, K rows past the score pass's last block of `step`
 * tokens, V rows past n. */
static inline __attribute__((always_inline)) void prefetch_rest(const Job *J, const int64_t *next,
                                                                int64_t n, int64_t nn,
                                                                int64_t step) {
    for (int64_t tt = (n + step - 1) / step * step; tt < nn; tt++) prefetch_row(J, J->k, next[tt]);
    for (int64_t tt = n; tt < nn; tt++) prefetch_row(J, J->v, next[tt]);
}

#endif

#if defined(JR_AVX512)

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

/* Scores of G query heads against 16 tokens (the K rows at off[0..15], which must all be valid
 * offsets; lanes past nt are set to -inf), times the softmax scale, into s[j * SPAN]. A cache
 * that is not float32 is converted once into kbuf, so the G heads do not convert it G times. */
static inline __attribute__((always_inline)) void scores16(const Job *J, const float *q,
                                                           const int64_t *off, int64_t nt,
                                                           float *kbuf, float *s, const int G,
                                                           const int C) {
    const int64_t hd = 16 * C;
    const float *krow[16];
    for (int tt = 0; tt < 16; tt++) {
        if (J->dtype == F32) {
            krow[tt] = (const float *)J->k + off[tt];
            continue;
        }
        const __m512 f = _mm512_set1_ps(code_scale(J->dtype, J->k_scale, off[tt], J->hd));
        for (int c = 0; c < C; c++) {
            const __m512 x = load16(J->k, J->dtype, off[tt] + 16 * c);
            _mm512_store_ps(kbuf + tt * hd + 16 * c, _mm512_mul_ps(f, x));
        }
        krow[tt] = kbuf + tt * hd;
    }
    const __mmask16 live = (__mmask16)((1u << nt) - 1u);
    for (int j = 0; j < G; j++) {
        __m512 qj[8], d[16]; /* fixed sizes: kept in registers (see item_avx2) */
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) qj[c] = _mm512_loadu_ps(q + j * hd + 16 * c);
        for (int tt = 0; tt < 16; tt++) {
            d[tt] = _mm512_mul_ps(qj[0], _mm512_loadu_ps(krow[tt]));
            for (int c = 1; c < C; c++)
                d[tt] = _mm512_fmadd_ps(qj[c], _mm512_loadu_ps(krow[tt] + 16 * c), d[tt]);
        }
        const __m512 sj = _mm512_mul_ps(hsum16(d), _mm512_set1_ps(J->scale));
        _mm512_store_ps(s + j * SPAN, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, sj));
    }
}

#if defined(__AVX512BF16__)
/* scores16 over a bfloat16 cache on AVX-512 BF16: the K rows as they are, against the queries
 * rounded to bfloat16 pairs of dims (qp: G heads x C/2 vectors), one vdpbf16ps two dims of 16. */
static inline __attribute__((always_inline)) void scores16_bf16(const Job *J, const __m512i *qp,
                                                                const int64_t *off, int64_t nt,
                                                                float *s, const int G,
                                                                const int C) {
    const uint16_t *k = J->k;
    const __mmask16 live = (__mmask16)((1u << nt) - 1u);
    for (int j = 0; j < G; j++) {
        __m512bh qj[4];
        __m512 d[16];
#pragma GCC unroll 4
        for (int c = 0; c < C / 2; c++) qj[c] = (__m512bh)_mm512_load_si512(qp + j * (C / 2) + c);
        for (int tt = 0; tt < 16; tt++) {
            const uint16_t *kr = k + off[tt];
            d[tt] = _mm512_dpbf16_ps(_mm512_setzero_ps(), qj[0],
                                     (__m512bh)_mm512_loadu_si512(kr));
#pragma GCC unroll 4
            for (int c = 1; c < C / 2; c++)
                d[tt] = _mm512_dpbf16_ps(d[tt], qj[c], (__m512bh)_mm512_loadu_si512(kr + 32 * c));
        }
        const __m512 sj = _mm512_mul_ps(hsum16(d), _mm512_set1_ps(J->scale));
        _mm512_store_ps(s + j * SPAN, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, sj));
    }
}

/* The span's weights s (G heads x SPAN tokens, zero past n up to a multiple of 16) as bfloat16
 * pairs of tokens: pw[j * SPAN / 2 + i] = (s[j][2i], s[j][2i + 1]). */
static inline __attribute__((always_inline)) void weight_pairs(const float *s, int64_t n,
                                                               uint32_t *pw, const int G) {
    for (int j = 0; j < G; j++)
        for (int64_t c0 = 0; c0 < n; c0 += 32) {
            const __m512 lo = _mm512_load_ps(s + j * SPAN + c0);
            const __m512 hi =
                c0 + 16 < n ? _mm512_load_ps(s + j * SPAN + c0 + 16) : _mm512_setzero_ps();
            _mm512_store_si512(pw + j * SPAN / 2 + c0 / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}
#define HAS_BF16_DOT 1
#else
#define HAS_BF16_DOT 0
#endif

/* One (row, kv head) with G query heads and head_dim 16 * C, in one pass over the context, SPAN
 * tokens at a time: their scores, then an online softmax update per head (running max and sum,
 * the output rescaled when the max grows), then the weighted V rows. The outputs stay in acc
 * between spans, in registers while V is read (CB of the C vectors per head at a time).
 * `after` is the item this thread takes next (-1: none); `fetched` says whether this item's first
 * span was requested during the previous one (prefetch_rows). */
static inline __attribute__((always_inline)) void item_avx512(const Job *J, int64_t r, int64_t h,
                                                              int64_t after, int fetched,
                                                              const int G, const int C,
                                                              const int BF) {
    const int CB = G * C <= 24 ? C : G * 4 <= 24 ? 4 : G * 2 <= 24 ? 2 : 1;
    const int64_t hd = 16 * C, L = J->ctx_lens[r], bs = J->bs;
    const float *q = J->q + r * J->ldq + h * G * hd;
    float *o = J->out + (r * J->nh + h * G) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * bs * hd;
    float acc[8 * 16 * 8] __attribute__((aligned(64)));
    float s[8 * SPAN] __attribute__((aligned(64)));
    float kbuf[16 * 16 * 8] __attribute__((aligned(64)));
    float vf[SPAN], alpha[8], m[8];
    __m512 sum[8];
    int64_t off_a[SPAN + 16], off_b[SPAN + 16], *off = off_a, *next = off_b;
    __m512i qp[8 * 4]; /* BF: the queries as bfloat16 pairs of dims, (G, C / 2) vectors */
    uint32_t pw[8 * SPAN / 2] __attribute__((aligned(64))); /* BF: weight pairs (weight_pairs) */
#if HAS_BF16_DOT
    if (BF)
        for (int j = 0; j < G; j++)
            for (int c = 0; c < C / 2; c++)
                qp[j * (C / 2) + c] = (__m512i)_mm512_cvtne2ps_pbh(
                    _mm512_loadu_ps(q + j * hd + 32 * c + 16), _mm512_loadu_ps(q + j * hd + 32 * c));
#endif
    memset(acc, 0, sizeof(float) * G * hd);
    for (int j = 0; j < G; j++) m[j] = -INFINITY, sum[j] = _mm512_setzero_ps();
    span_offsets(table, bs, hd, head_base, 0, L < SPAN ? L : SPAN, next);
    for (int64_t t0 = 0; t0 < L; t0 += SPAN) {
        const int64_t n = L - t0 < SPAN ? L - t0 : SPAN;
        int64_t *tmp = off;
        off = next, next = tmp;
        int64_t nn = L - t0 - SPAN < 0 ? 0 : L - t0 - SPAN < SPAN ? L - t0 - SPAN : SPAN;
        span_offsets(table, bs, hd, head_base, t0 + SPAN, nn, next);
        if (nn == 0 && after >= 0) { /* the last span: the next item's first one is fetched */
            const int64_t r2 = after / J->nkv, h2 = after % J->nkv, L2 = J->ctx_lens[r2];
            nn = L2 < SPAN ? L2 : SPAN;
            span_offsets(J->tables + r2 * J->table_stride, bs, hd, h2 * J->num_blocks * bs * hd,
                         0, nn, next);
        }
        for (int64_t tt = n; tt < ((n + 15) & ~15); tt++) off[tt] = off[0]; /* tail: a real row */
        for (int64_t c0 = 0; c0 < n; c0 += 16) {
            /* a thread's first span: the next 16 tokens' rows are requested as these compute */
            if (t0 == 0 && !fetched && c0 + 16 < n)
                prefetch_rows(J, off + c0 + 16, n - c0 - 16 < 16 ? n - c0 - 16 : 16);
            for (int64_t tt = c0; tt < c0 + 16 && tt < nn; tt++) /* the next span's K rows */
                prefetch_row(J, J->k, next[tt]);
#if HAS_BF16_DOT
            if (BF) {
                scores16_bf16(J, qp, off + c0, n - c0 < 16 ? n - c0 : 16, s + c0, G, C);
                continue;
            }
#endif
            scores16(J, q, off + c0, n - c0 < 16 ? n - c0 : 16, kbuf, s + c0, G, C);
        }
        for (int j = 0; j < G; j++) { /* the online softmax update over this span */
            __m512 mx = _mm512_load_ps(s + j * SPAN);
            for (int64_t c0 = 16; c0 < n; c0 += 16)
                mx = _mm512_max_ps(mx, _mm512_load_ps(s + j * SPAN + c0));
            const float m_new = fmaxf(m[j], _mm512_reduce_max_ps(mx));
            const __m512 mv = _mm512_set1_ps(m_new);
            __m512 e_sum = _mm512_setzero_ps();
            for (int64_t c0 = 0; c0 < n; c0 += 16) {
                float *sc = s + j * SPAN + c0; /* scores -> weights in place; -inf lanes -> 0 */
                const __mmask16 live = (__mmask16)(n - c0 >= 16 ? 0xffffu : (1u << (n - c0)) - 1u);
                const __m512 x = _mm512_sub_ps(_mm512_load_ps(sc), mv);
                const __m512 e = _mm512_maskz_mov_ps(live, exp_neg16(x));
                e_sum = _mm512_add_ps(e_sum, e);
                _mm512_store_ps(sc, e);
            }
            alpha[j] = m[j] == -INFINITY ? 0.0f : exp_neg(m[j] - m_new);
            sum[j] = _mm512_fmadd_ps(sum[j], _mm512_set1_ps(alpha[j]), e_sum);
            m[j] = m_new;
        }
#if HAS_BF16_DOT
        if (BF) weight_pairs(s, n, pw, G); /* a bfloat16 row has no scale */
#endif
        for (int64_t tt = 0; !BF && tt < n; tt++)
            vf[tt] = code_scale(J->dtype, J->v_scale, off[tt], hd);
        for (int cb = 0; cb < C; cb += CB) { /* acc += weights x V, CB vectors per head a pass */
            __m512 a[8][8]; /* fixed sizes: kept in registers (see item_avx2) */
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
#pragma GCC unroll 8
                for (int c = 0; c < CB; c++) {
                    const __m512 prev = _mm512_load_ps(acc + j * hd + 16 * (cb + c));
                    a[j][c] = _mm512_mul_ps(_mm512_set1_ps(alpha[j]), prev);
                }
#if HAS_BF16_DOT
            for (int64_t tp = 0; BF && tp < (n + 1) / 2; tp++) { /* two tokens an instruction */
                const int64_t t0 = 2 * tp, t1 = t0 + 1 < n ? t0 + 1 : t0; /* odd tail: weight 0 */
                for (int64_t tt = t0; cb == 0 && tt < t0 + 2 && tt < nn; tt++) /* its V rows */
                    prefetch_row(J, J->v, next[tt]);
                const uint16_t *v0 = (const uint16_t *)J->v + off[t0];
                const uint16_t *v1 = (const uint16_t *)J->v + off[t1];
                __m512bh v[8];
#pragma GCC unroll 8
                for (int c = 0; c < CB; c++)
                    v[c] = (__m512bh)row_pairs(v0 + 16 * (cb + c), v1 + 16 * (cb + c));
#pragma GCC unroll 8
                for (int j = 0; j < G; j++) {
                    const __m512bh pj = (__m512bh)_mm512_set1_epi32((int)pw[j * SPAN / 2 + tp]);
#pragma GCC unroll 8
                    for (int c = 0; c < CB; c++) a[j][c] = _mm512_dpbf16_ps(a[j][c], pj, v[c]);
                }
            }
#endif
            for (int64_t tt = 0; !BF && tt < n; tt++) {
                if (cb == 0 && tt < nn) prefetch_row(J, J->v, next[tt]); /* the next span's */
                __m512 v[8];
#pragma GCC unroll 8
                for (int c = 0; c < CB; c++) v[c] = load16(J->v, J->dtype, off[tt] + 16 * (cb + c));
#pragma GCC unroll 8
                for (int j = 0; j < G; j++) {
                    const __m512 pj = _mm512_set1_ps(s[j * SPAN + tt] * vf[tt]);
#pragma GCC unroll 8
                    for (int c = 0; c < CB; c++) a[j][c] = _mm512_fmadd_ps(pj, v[c], a[j][c]);
                }
            }
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
#pragma GCC unroll 8
                for (int c = 0; c < CB; c++) _mm512_store_ps(acc + j * hd + 16 * (cb + c), a[j][c]);
        }
        prefetch_rest(J, next, n, nn, 16); /* a next span longer than this one */
    }
    for (int j = 0; j < G; j++) {
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[j]));
        for (int c = 0; c < C; c++)
            _mm512_storeu_ps(o + j * hd + 16 * c, _mm512_mul_ps(_mm512_load_ps(acc + j * hd + 16 * c), inv));
    }
}

#define ITEM_FNS(G, C) /* a function per layout and cache kind: head_cases.h */ \
    static __attribute__((noinline)) void item_##G##_##C##_bf16(const Job *J, int64_t r, \
                                                               int64_t h, int64_t after, \
                                                               int fetched) { \
        item_avx512(J, r, h, after, fetched, G, C, 1); \
    } \
    static __attribute__((noinline)) void item_##G##_##C(const Job *J, int64_t r, int64_t h, \
                                                        int64_t after, int fetched) { \
        item_avx512(J, r, h, after, fetched, G, C, 0); \
    }
HEAD_CASES(ITEM_FNS, 4, 8)
#undef ITEM_FNS

#define ITEM_CASE(G, C) \
    case (G) * 16 + (C): \
        if (HAS_BF16_DOT && J->dtype == BF16) item_##G##_##C##_bf16(J, r, h, after, fetched); \
        else item_##G##_##C(J, r, h, after, fetched); \
        return 1;

/* 1 when a specialised path handled the item (head_dim 64 or 128, up to 8 heads per KV head). */
static int item_fast(const Job *J, int64_t r, int64_t h, int64_t after, int fetched) {
    const int64_t g = J->nh / J->nkv;
    switch (g * 16 + J->hd / 16 * (J->hd % 16 == 0)) {
        HEAD_CASES(ITEM_CASE, 4, 8)
    }
    return 0;
}
#elif defined(JR_AVX2)

/* d[0..7] -> one vector whose lane t is the sum of d[t]'s lanes (hsum16 for 8 lanes). */
static inline __m256 hsum8(const __m256 d[8]) {
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(d[0], d[1]), _mm256_hadd_ps(d[2], d[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(d[4], d[5]), _mm256_hadd_ps(d[6], d[7]));
    /* t0: tokens 0-3 over d's lanes 0-3, then the same over lanes 4-7; t1: tokens 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* scores16 with 8 tokens a vector: the K rows at off[0..7] (all valid; lanes past nt -inf). */
static inline __attribute__((always_inline)) void scores8(const Job *J, const float *q,
                                                          const int64_t *off, int64_t nt,
                                                          float *kbuf, float *s, const int G,
                                                          const int C) {
    const int64_t hd = 8 * C;
    const float *krow[8];
    for (int tt = 0; tt < 8; tt++) {
        if (J->dtype == F32) {
            krow[tt] = (const float *)J->k + off[tt];
            continue;
        }
        const __m256 f = _mm256_set1_ps(code_scale(J->dtype, J->k_scale, off[tt], J->hd));
        for (int c = 0; c < C; c++) {
            const __m256 x = load8(J->k, J->dtype, off[tt] + 8 * c);
            _mm256_store_ps(kbuf + tt * hd + 8 * c, _mm256_mul_ps(f, x));
        }
        krow[tt] = kbuf + tt * hd;
    }
    const __m256 live = _mm256_castsi256_ps(tail_mask8(nt));
    for (int j = 0; j < G; j++) {
        __m256 d[8]; /* 8 chains, one per token, interleaved over head_dim */
        const __m256 q0 = _mm256_loadu_ps(q + j * hd);
        for (int tt = 0; tt < 8; tt++) d[tt] = _mm256_mul_ps(q0, _mm256_loadu_ps(krow[tt]));
        for (int c = 1; c < C; c++) {
            const __m256 qc = _mm256_loadu_ps(q + j * hd + 8 * c);
            for (int tt = 0; tt < 8; tt++)
                d[tt] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(krow[tt] + 8 * c), d[tt]);
        }
        const __m256 sj = _mm256_mul_ps(hsum8(d), _mm256_set1_ps(J->scale));
        _mm256_store_ps(s + j * SPAN, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sj, live));
    }
}

/* Registers of the AVX2 V pass: G * CB accumulators, G weights and a V vector, at most 15 (one
 * left to the compiler; at 16 it spilled an accumulator, every token a store-to-load chain). */
#define CB_AVX2(G, C) \
    ((9 * (G) + 1 <= 15 && (C) % 8 == 0)   ? 8 \
     : (5 * (G) + 1 <= 15 && (C) % 4 == 0) ? 4 \
     : (3 * (G) + 1 <= 15)                 ? 2 \
                                           : 1)

/* acc (G heads x 8 C floats) = alpha * acc + weights x V over the n tokens at off, CB vectors
 * of each head a pass. Meanwhile the next span's V rows (the nn at next) are requested, their
 * cache lines spread over the passes: pass i fetches lines i, i + passes, ... of each row (the
 * score pass requests the K rows the same way). */
static inline __attribute__((always_inline)) void v_pass(const Job *J, const int64_t *off,
                                                         const int64_t *next, int64_t n,
                                                         int64_t nn, const float *s,
                                                         const float *alpha, float *acc,
                                                         const int dtype, const int G,
                                                         const int C, const int CB) {
    const int64_t hd = 8 * C, width = elem_bytes(dtype), lines = (hd * width + 63) / 64;
    const char *vb = (const char *)J->v;
    for (int cb = 0; cb < C; cb += CB) {
        const int64_t pass = cb / CB, passes = C / CB;
        __m256 a[8][8];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            const __m256 aj = _mm256_set1_ps(alpha[j]);
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++)
                a[j][c] = _mm256_mul_ps(aj, _mm256_load_ps(acc + j * hd + 8 * (cb + c)));
        }
        for (int64_t tt = 0; tt < n; tt++) {
            if (tt < nn)
                for (int64_t l = pass; l < lines; l += passes)
                    _mm_prefetch(vb + next[tt] * width + 64 * l, _MM_HINT_T1);
            __m256 p[8];
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) p[j] = _mm256_broadcast_ss(s + j * SPAN + tt);
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++) {
                const __m256 v = load8(J->v, dtype, off[tt] + 8 * (cb + c));
#pragma GCC unroll 8
                for (int j = 0; j < G; j++) a[j][c] = _mm256_fmadd_ps(p[j], v, a[j][c]);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++) _mm256_store_ps(acc + j * hd + 8 * (cb + c), a[j][c]);
    }
}

/* item_avx512 with 8-float vectors (head_dim 8 * C), the same spans, online softmax and
 * prefetches. While V is read, CB of each head's C output vectors stay in registers with the G
 * weights of the token: G * CB + G + 1 of AVX2's 16 registers. The arrays have fixed sizes (G, C
 * at most 8 and 16) so that, G and C being constants here, the compiler keeps them in registers:
 * as variable-length arrays they lived on the stack, every FMA a load and a store. */
static inline __attribute__((always_inline)) void item_avx2(const Job *J, int64_t r, int64_t h,
                                                            int64_t after, int fetched,
                                                            const int G, const int C) {
    const int CB = CB_AVX2(G, C);
    const int64_t hd = 8 * C, L = J->ctx_lens[r], bs = J->bs;
    const int dtype = J->dtype;
    const float *q = J->q + r * J->ldq + h * G * hd;
    float *o = J->out + (r * J->nh + h * G) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * bs * hd;
    float acc[8 * 8 * 16] __attribute__((aligned(32)));
    float s[8 * SPAN] __attribute__((aligned(32)));
    float kbuf[8 * 8 * 16] __attribute__((aligned(32)));
    float vf[SPAN], alpha[8], m[8];
    __m256 sum[8];
    int64_t off_a[SPAN + 16], off_b[SPAN + 16], *off = off_a, *next = off_b;
    memset(acc, 0, sizeof(float) * G * hd);
    for (int j = 0; j < G; j++) m[j] = -INFINITY, sum[j] = _mm256_setzero_ps();
    span_offsets(table, bs, hd, head_base, 0, L < SPAN ? L : SPAN, next);
    for (int64_t t0 = 0; t0 < L; t0 += SPAN) {
        const int64_t n = L - t0 < SPAN ? L - t0 : SPAN;
        int64_t *tmp = off;
        off = next, next = tmp;
        int64_t nn = L - t0 - SPAN < 0 ? 0 : L - t0 - SPAN < SPAN ? L - t0 - SPAN : SPAN;
        span_offsets(table, bs, hd, head_base, t0 + SPAN, nn, next);
        if (nn == 0 && after >= 0) { /* the last span: the next item's first one is fetched */
            const int64_t r2 = after / J->nkv, h2 = after % J->nkv, L2 = J->ctx_lens[r2];
            nn = L2 < SPAN ? L2 : SPAN;
            span_offsets(J->tables + r2 * J->table_stride, bs, hd, h2 * J->num_blocks * bs * hd,
                         0, nn, next);
        }
        for (int64_t tt = n; tt < ((n + 7) & ~7); tt++) off[tt] = off[0]; /* tail: a real row */
        for (int64_t c0 = 0; c0 < n; c0 += 8) {
            if (t0 == 0 && !fetched && c0 + 8 < n)
                prefetch_rows(J, off + c0 + 8, n - c0 - 8 < 8 ? n - c0 - 8 : 8);
            for (int64_t tt = c0; tt < c0 + 8 && tt < nn; tt++) /* the next span's K rows */
                prefetch_row(J, J->k, next[tt]);
            scores8(J, q, off + c0, n - c0 < 8 ? n - c0 : 8, kbuf, s + c0, G, C);
        }
        for (int j = 0; j < G; j++) { /* the online softmax update over this span */
            __m256 mx = _mm256_load_ps(s + j * SPAN);
            for (int64_t c0 = 8; c0 < n; c0 += 8)
                mx = _mm256_max_ps(mx, _mm256_load_ps(s + j * SPAN + c0));
            const float m_new = fmaxf(m[j], hmax8(mx));
            const __m256 mv = _mm256_set1_ps(m_new);
            __m256 e_sum = _mm256_setzero_ps();
            for (int64_t c0 = 0; c0 < n; c0 += 8) {
                float *sc = s + j * SPAN + c0; /* scores -> weights in place; -inf lanes -> 0 */
                const __m256 live = _mm256_castsi256_ps(tail_mask8(n - c0 >= 8 ? 8 : n - c0));
                const __m256 x = _mm256_sub_ps(_mm256_load_ps(sc), mv);
                const __m256 e = _mm256_and_ps(live, exp_neg8(x));
                e_sum = _mm256_add_ps(e_sum, e);
                _mm256_store_ps(sc, e);
            }
            alpha[j] = m[j] == -INFINITY ? 0.0f : exp_neg(m[j] - m_new);
            sum[j] = _mm256_fmadd_ps(sum[j], _mm256_set1_ps(alpha[j]), e_sum);
            m[j] = m_new;
        }
        if (dtype == I8 || dtype == FP8) { /* weights times each V row's scale */
            for (int64_t tt = 0; tt < n; tt++) vf[tt] = code_scale(dtype, J->v_scale, off[tt], hd);
            for (int j = 0; j < G; j++)
                for (int64_t tt = 0; tt < n; tt++) s[j * SPAN + tt] *= vf[tt];
        }
        /* float32 (the exact path) with its format a constant, no test per load; one copy for
         * the others keeps the build short (a copy per format doubled its compile time) */
        if (dtype == F32)
            v_pass(J, off, next, n, nn, s, alpha, acc, F32, G, C, CB);
        else
            v_pass(J, off, next, n, nn, s, alpha, acc, dtype, G, C, CB);
        prefetch_rest(J, next, n, nn, 8); /* a next span longer than this one */
    }
    for (int j = 0; j < G; j++) {
        const __m256 inv = _mm256_set1_ps(1.0f / hadd8(sum[j]));
        for (int c = 0; c < C; c++)
            _mm256_storeu_ps(o + j * hd + 8 * c, _mm256_mul_ps(_mm256_load_ps(acc + j * hd + 8 * c), inv));
    }
}

#define ITEM_FN(G, C) /* a function per layout: head_cases.h */ \
    static __attribute__((noinline)) void item_##G##_##C(const Job *J, int64_t r, int64_t h, \
                                                        int64_t after, int fetched) { \
        item_avx2(J, r, h, after, fetched, G, C); \
    }
HEAD_CASES(ITEM_FN, 8, 16)
#undef ITEM_FN

#define ITEM_CASE(G, C) \
    case (G) * 32 + (C): item_##G##_##C(J, r, h, after, fetched); return 1;

/* 1 when a specialised path handled the item (head_dim 64 or 128, up to 8 heads per KV head). */
static int item_fast(const Job *J, int64_t r, int64_t h, int64_t after, int fetched) {
    const int64_t g = J->nh / J->nkv;
    switch (g * 32 + J->hd / 8 * (J->hd % 8 == 0)) {
        HEAD_CASES(ITEM_CASE, 8, 16)
    }
    return 0;
}
#else
static int item_fast(const Job *J, int64_t r, int64_t h, int64_t after, int fetched) {
    (void)J, (void)r, (void)h, (void)after, (void)fetched;
    return 0;
}
#endif

static void one_item(const Job *J, int64_t item, int64_t after, int fetched, float *scores,
                     float *row) {
    if (item_fast(J, item / J->nkv, item % J->nkv, after, fetched)) return;
    const int64_t r = item / J->nkv, h = item % J->nkv;
    const int64_t g = J->nh / J->nkv, hd = J->hd, L = J->ctx_lens[r];
    const float *q = J->q + r * J->ldq + h * g * hd; /* g query heads, contiguous */
    float *o = J->out + (r * J->nh + h * g) * hd;
    const int64_t *table = J->tables + r * J->table_stride;
    const int64_t head_base = h * J->num_blocks * J->bs * hd;
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / J->bs] * J->bs + t % J->bs) * hd;
        const float *kt = load_row(J, J->k, J->k_scale, off, row);
        for (int64_t j = 0; j < g; j++) scores[j * L + t] = dot(q + j * hd, kt, hd) * J->scale;
    }
    softmax_rows(scores, g, L);
    memset(o, 0, g * hd * sizeof(float));
#if defined(JR_NEON)
    const VPass P = {J->dtype, J->v, J->v_scale, table, J->bs, hd, head_base, L, scores, o};
    if (v_pass_neon(&P, g)) return;
#endif
    for (int64_t t = 0; t < L; t++) {
        const int64_t off = head_base + (table[t / J->bs] * J->bs + t % J->bs) * hd;
        const float *vt = load_row(J, J->v, J->v_scale, off, row);
        for (int64_t j = 0; j < g; j++) {
            const float p = scores[j * L + t];
            float *oj = o + j * hd;
            for (int64_t i = 0; i < hd; i++) oj[i] += p * vt[i];
        }
    }
}

static inline int64_t claim(int64_t *counter) {
    int64_t i;
#pragma omp atomic capture
    i = (*counter)++;
    return i;
}

/* Returns 0 on success. Parallel over (row, kv head) pairs with OpenMP: loaded after torch, the
 * library binds to torch's own libgomp (same soname), so it shares torch's thread pool. q: (b,
 * nh, hd) with row stride ldq floats (decode_layers.c reads the queries in place from a step's
 * fused q/k/v rows). */
int paged_decode_ld(const float *q, int64_t ldq, const void *k, const void *v,
                    const uint16_t *k_scale, const uint16_t *v_scale, int dtype,
                    const int64_t *tables, int64_t table_stride, const int64_t *ctx_lens,
                    int64_t b, int64_t nh, int64_t nkv, int64_t hd, int64_t num_blocks,
                    int64_t bs, float scale, float *out, int threads) {
    int64_t max_ctx = 1;
    for (int64_t r = 0; r < b; r++) max_ctx = ctx_lens[r] > max_ctx ? ctx_lens[r] : max_ctx;
    const Job J = {q, ldq, k, v, k_scale, v_scale, dtype, tables, table_stride, ctx_lens, b, nh,
                   nkv, hd, num_blocks, bs, max_ctx, scale, out};
    const int64_t g = nh / nkv, items = b * nkv;
    int failed = 0;
    int64_t counter = 0;
#pragma omp parallel num_threads(threads < 1 ? 1 : threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (g * max_ctx + hd));
        if (!scores) failed = 1;
        /* longest rows first (rows come sorted by length, shortest first), claimed one at a
         * time; each thread claims its next item before it works on the current one */
        int64_t i = claim(&counter), after;
        for (int fetched = 0; i < items; i = after, fetched = 1) {
            after = claim(&counter);
            if (scores)
                one_item(&J, items - 1 - i, after < items ? items - 1 - after : -1, fetched,
                         scores, scores + g * max_ctx);
        }
        free(scores);
    }
    return failed;
}

/* paged_decode_ld() with contiguous queries, (b, nh, hd). */
int paged_decode(const float *q, const void *k, const void *v, const uint16_t *k_scale,
                 const uint16_t *v_scale, int dtype, const int64_t *tables,
                 int64_t table_stride, const int64_t *ctx_lens, int64_t b, int64_t nh,
                 int64_t nkv, int64_t hd, int64_t num_blocks, int64_t bs, float scale,
                 float *out, int threads) {
    return paged_decode_ld(q, nh * hd, k, v, k_scale, v_scale, dtype, tables, table_stride,
                           ctx_lens, b, nh, nkv, hd, num_blocks, bs, scale, out, threads);
}
