/* Prefill attention over a bfloat16 cache on AMX tiles (Sapphire Rapids and later), for the
 * mixed mode's float32 queries: paged_prefill() hands it a chunk when AMX is on; an 8-bit cache
 * (int8, fp8) too when its model computes in bfloat16.
 *
 * Per KV head, the keys the chunk sees (positions 0..L-1) are first laid out once for the
 * tiles: K rows gathered from their blocks into one (Lp, hd) matrix, V transposed in blocks of
 * 32 keys, (Lp / 32, hd, 32), Lp = L rounded up to 32, the keys past L zero; an 8-bit cache's
 * rows as their codes times their scale, rounded to bfloat16 as they are laid out (bench (b)
 * over an int8 cache on 2 cores of an AMX Xeon: prefill attention 7.3 -> 2.8 s of CPU, against
 * the vector path's float32). Then each (KV
 * head, tile of 16 query tokens) item, per query head of the group and span of 64 keys:
 *   scores  S^T (16 keys x 16 tokens) = K rows (A tile: 16 keys x 32 dims) x the queries as
 *           bfloat16 pairs of dims (B tile: 16 pairs x 16 tokens), the head dims in steps of 32;
 *   softmax lane-wise over the 16 tokens in powers of 2 (scale, causal mask, running max and
 *           sum in float32; the max moves only when scores pass it by 2^8, so the outputs are
 *           rarely rescaled), the weights rounded to bfloat16 pairs of keys;
 *   outputs O^T (16 dims x 16 tokens) += V^T (A tile: 16 dims x 32 keys) x the weights (B tile:
 *           16 key pairs x 16 tokens), accumulated in float32 tiles loaded from and stored to
 *           the item's accumulators, which the softmax rescales lane-wise.
 * So both products run 16 x 16 x 32 multiply-adds an instruction with no transposition in the
 * loop; the queries are rounded to bfloat16 as on the vdpbf16ps path (same tolerance).
 * Against the vdpbf16ps path on 2 cores of an AMX Xeon (SmolLM2's heads, from position 0):
 * 512 tokens 1.72 -> 0.34 ms, 2,048 tokens 25.9 -> 3.5 ms (docs/performance.md).
 * Returns 0, 1 when the layout scratch cannot be allocated, 2 when AMX is off, not built or
 * not granted; on 1 or 2 the caller takes its vector path, which needs no scratch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16_pairs.h"
#include "head_cases.h"
#include "kv_load.h"
#include "prefill_tile.h"
#include "vexp.h"

#ifdef JR_AMX

enum { QT = 16, SPAN = 64 }; /* query tokens per tile; keys per online-softmax update */
static const uint16_t ZERO16[16]; /* a V row's 16 values past the keys */
#define LAYOUT_BYTES (32 << 20) /* K and V laid out for this many bytes of KV heads at once */

typedef struct {
    const float *q; /* (n, nh, hd), row stride ldq floats */
    int64_t ldq, start, n, nh, nkv, hd;
    float scale;
    float *out; /* (n, nh, hd) */
} Chunk;

typedef struct {
    const void *k, *v;                 /* (nkv, num_blocks, bs, hd) bfloat16, or 8-bit codes */
    const uint16_t *k_scale, *v_scale; /* (nkv, num_blocks, bs) float16 for I8 / FP8 */
    int dtype;                         /* BF16, I8 or FP8 (kv_load.h) */
} Cache;

/* One row of an 8-bit cache (hd codes at element `off`) as bfloat16: codes times the row's
 * scale in float32, rounded to the nearest even. */
static inline void widen_row(const void *base, const uint16_t *scales, int dtype, int64_t off,
                             int64_t hd, uint16_t *dst) {
    const __m512 f = _mm512_set1_ps(code_scale(dtype, scales, off, hd));
    for (int64_t c = 0; c < hd; c += 16) {
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(f, load16(base, dtype, off + c)));
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)h);
    }
}

/* Keys t0..t0+31 of one head (cache elements from head_base) into kc (Lp, hd) and vt
 * (Lp / 32, hd, 32), each 32 keys' V transposed so 16 dims of them are one contiguous A tile:
 * 16 key pairs of 16 dims interleaved (lane d: the pair's two values of dim d) and transposed
 * in registers, so each dim's 32 keys are one store; keys past L are zero. */
static void lay_out(const Cache *kv, const int64_t *table, int64_t bs, int64_t hd,
                    int64_t head_base, int64_t L, int64_t t0, uint16_t *kc, uint16_t *vt) {
    int64_t off[32]; /* cache offset of each key, -1 past L */
    const uint16_t *vrow[32]; /* each key's V row in bfloat16: in the cache, or vq; NULL past L */
    uint16_t vq[32 * 128] __attribute__((aligned(64))); /* an 8-bit cache's V rows, widened */
    for (int64_t i = 0; i < 32; i++) {
        const int64_t t = t0 + i;
        off[i] = t < L ? head_base + (table[t / bs] * bs + t % bs) * hd : -1;
        vrow[i] = NULL;
        if (off[i] < 0) {
            memset(kc + t * hd, 0, (size_t)hd * 2);
        } else if (kv->dtype == BF16) {
            memcpy(kc + t * hd, (const uint16_t *)kv->k + off[i], (size_t)hd * 2);
            vrow[i] = (const uint16_t *)kv->v + off[i];
        } else { /* codes times their row's scale, rounded to bfloat16 as the tiles read them */
            widen_row(kv->k, kv->k_scale, kv->dtype, off[i], hd, kc + t * hd);
            widen_row(kv->v, kv->v_scale, kv->dtype, off[i], hd, vq + i * hd);
            vrow[i] = vq + i * hd;
        }
    }
    for (int64_t c = 0; c < hd; c += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; i++) {
            const uint16_t *a = vrow[2 * i], *b = vrow[2 * i + 1];
            r[i] = row_pairs(a ? a + c : ZERO16, b ? b + c : ZERO16);
        }
        transpose16(r); /* r[d]: dim c + d of the 16 key pairs */
        for (int d = 0; d < 16; d++) _mm512_store_si512(vt + (t0 * hd + (c + d) * 32), r[d]);
    }
}

/* How far (in powers of 2) a lane's running max may trail the scores before it is moved: the
 * weights stay below 2^8, and the outputs are rescaled only when a lane's max moves. */
#define MAX_SLACK 8.0f

/* Keys s0..s0+ns-1 against the tile's 16 token positions: lanes a key is after are masked. */
#define LIVE(t) _mm512_cmp_epi32_mask(pos, _mm512_set1_epi32((int)(s0 + (t))), _MM_CMPINT_NLT)

/* The weight of key t as a power of 2 of its score times c less m. */
static inline __attribute__((always_inline)) __m512 weight(const float *p, int64_t t, int64_t s0,
                                                           __m512i pos, const int diagonal,
                                                           __m512 c, __m512 m, int64_t stride) {
    __m512 y = _mm512_fmsub_ps(_mm512_load_ps(p + t * stride), c, m);
    if (diagonal) y = _mm512_mask_mov_ps(_mm512_set1_ps(PREFILL_MASKED), LIVE(t), y);
    return exp2_16(y);
}

/* One head's scores of keys s0..s0+ns-1 (p: key, G, 16 tokens) become bfloat16 weights paired
 * over keys in pw (pair, G, 16 tokens; pairs up to `pairs` zero past the keys), in powers of 2:
 * the scores times c = scale x log2(e), masked causally where the span reaches the diagonal,
 * the running max m (in those units) and sum updated, acc (hd, 16 tokens) rescaled where m
 * moved. Two passes over the scores as the tiles stored them: their max, then the weights. */
static inline __attribute__((always_inline)) void softmax_span(const float *p, uint32_t *pw,
                                                               int64_t s0, int64_t ns,
                                                               int64_t pairs, __m512i pos,
                                                               const int diagonal, __m512 c,
                                                               __m512 *m, __m512 *sum,
                                                               float *acc, int64_t hd,
                                                               const int G, const int j) {
    const int64_t stride = G * 16;
    p += j * 16, pw += j * 16;
    /* four running maxima in registers: one chain would wait on each max's latency */
    __m512 m0 = _mm512_set1_ps(PREFILL_MASKED), m1 = m0, m2 = m0, m3 = m0;
#define MAX_OF(acc, t)                                                                      \
    acc = diagonal ? _mm512_mask_max_ps(acc, LIVE(t), acc, _mm512_load_ps(p + (t) * stride)) \
                   : _mm512_max_ps(acc, _mm512_load_ps(p + (t) * stride))
    int64_t t = 0;
    for (; t + 3 < ns; t += 4) {
        MAX_OF(m0, t);
        MAX_OF(m1, t + 1);
        MAX_OF(m2, t + 2);
        MAX_OF(m3, t + 3);
    }
    for (; t < ns; t++) MAX_OF(m0, t);
#undef MAX_OF
    /* every lane sees key 0, so after the first span every lane's max is a score */
    const __m512 mx =
        _mm512_mul_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)), c);
    const __mmask16 moved =
        _mm512_cmp_ps_mask(mx, _mm512_add_ps(*m, _mm512_set1_ps(MAX_SLACK)), _CMP_GT_OQ);
    const __m512 mnew = _mm512_mask_mov_ps(*m, moved, mx);
    __m512 s0_ = _mm512_setzero_ps(), s1_ = _mm512_setzero_ps(), e0, e1;
    int64_t tp = 0;
    for (; 2 * tp + 1 < ns; tp++) {
        e0 = weight(p, 2 * tp, s0, pos, diagonal, c, mnew, stride);
        e1 = weight(p, 2 * tp + 1, s0, pos, diagonal, c, mnew, stride);
        s0_ = _mm512_add_ps(s0_, e0), s1_ = _mm512_add_ps(s1_, e1);
        _mm512_store_si512(pw + tp * stride, pairs_of(e0, e1));
    }
    if (2 * tp < ns) { /* an odd last key: its pair's second weight is 0 */
        e0 = weight(p, 2 * tp, s0, pos, diagonal, c, mnew, stride);
        s0_ = _mm512_add_ps(s0_, e0);
        _mm512_store_si512(pw + tp * stride, pairs_of(e0, _mm512_setzero_ps()));
        tp++;
    }
    for (; tp < pairs; tp++) _mm512_store_si512(pw + tp * stride, _mm512_setzero_si512());
    /* exactly 1 where m stays (exp2_16(0) is its polynomial's constant, 1 + 2.5e-6) */
    const __m512 alpha =
        _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), moved, exp2_16(_mm512_sub_ps(*m, mnew)));
    *sum = _mm512_fmadd_ps(*sum, alpha, _mm512_add_ps(s0_, s1_));
    *m = mnew;
    if (moved)
        for (int64_t d = 0; d < hd; d++)
            _mm512_store_ps(acc + d * 16, _mm512_mul_ps(alpha, _mm512_load_ps(acc + d * 16)));
}

/* Tiles 0-3: C (scores of 4 heads, or 4 x 16 dims of outputs), 4: A, 5: B. The tile numbers
 * are part of the instruction, hence the macros. */
#define SCORES(T)                                                                        \
    if (j0 + (T) < G) {                                                                  \
        _tile_loadd(5, qt + (16 * s * G + j0 + (T)) * 16, G * 64);                       \
        _tile_dpbf16ps(T, 4, 5);                                                         \
    }
#define STORE_SCORES(T) \
    if (j0 + (T) < G) _tile_stored(T, p + (j0 + (T)) * 16 + kg * G * 16, G * 64);
#define OUTPUTS_LOAD(T) _tile_loadd(T, a + (c0 + 16 * (T)) * 16, 64);
#define OUTPUTS(T)                                                                    \
    _tile_loadd(4, vt + (s0 + 32 * s) * hd + (c0 + 16 * (T)) * 32, 64);            \
    _tile_dpbf16ps(T, 4, 5);
#define OUTPUTS_STORE(T) _tile_stored(T, a + (c0 + 16 * (T)) * 16, 64);

/* One (KV head h, query tile ti) item with G query heads and head_dim 16 * C. */
static inline __attribute__((always_inline)) void tile_item(const Chunk *C_, const uint16_t *kc,
                                                            const uint16_t *vt, int64_t h,
                                                            int64_t ti, const int G,
                                                            const int C) {
    const int64_t hd = 16 * C, hp = 8 * C, i0 = ti * QT;
    const int64_t qn = C_->n - i0 < QT ? C_->n - i0 : QT, ld = C_->nh * hd;
    const int64_t L = C_->start + i0 + qn; /* keys the tile's last query sees */
    uint32_t qt[8 * C * G * 16] __attribute__((aligned(64)));     /* (hd/2 pairs, G, 16) */
    float acc[G * 16 * C * 16] __attribute__((aligned(64)));      /* (G, hd, 16 tokens) */
    float p[SPAN * G * 16] __attribute__((aligned(64)));          /* (key, G, 16 tokens) */
    uint32_t pw[SPAN / 2 * G * 16] __attribute__((aligned(64))); /* (key pair, G, 16) */
    __m512 m[G], sum[G];
    for (int j = 0; j < G; j++) /* 16 pairs of dims of the 16 tokens at a time, transposed */
        for (int64_t e0 = 0; e0 < hp; e0 += 16) {
            __m512i r[16];
            for (int64_t qi = 0; qi < QT; qi++) {
                const float *qr = C_->q + (i0 + qi) * C_->ldq + (h * G + j) * hd + 2 * e0;
                r[qi] = qi < qn ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qr + 16),
                                                               _mm512_loadu_ps(qr))
                                : _mm512_setzero_si512();
            }
            transpose16(r); /* r[e]: pair e0 + e of the 16 tokens */
            for (int e = 0; e < 16; e++) _mm512_store_si512(qt + ((e0 + e) * G + j) * 16, r[e]);
        }
    memset(acc, 0, sizeof(acc));
    for (int j = 0; j < G; j++) m[j] = _mm512_set1_ps(PREFILL_MASKED), sum[j] = _mm512_setzero_ps();
    const __m512i pos = lane_positions(C_->start + i0, L);
    const __m512 c = _mm512_set1_ps(C_->scale * EXP_LOG2E); /* scores as powers of 2 */
    const int64_t first = C_->start + i0; /* the tile's first query position */
    for (int64_t s0 = 0; s0 < L; s0 += SPAN) {
        const int64_t ns = L - s0 < SPAN ? L - s0 : SPAN, steps = (ns + 31) / 32;
        for (int64_t kg = 0; kg < ns; kg += 16) /* scores of 16 keys, 4 heads at a time */
            for (int j0 = 0; j0 < G; j0 += 4) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t s = 0; s < C / 2; s++) {
                    _tile_loadd(4, kc + (s0 + kg) * hd + 32 * s, hd * 2);
                    SCORES(0) SCORES(1) SCORES(2) SCORES(3)
                }
                STORE_SCORES(0) STORE_SCORES(1) STORE_SCORES(2) STORE_SCORES(3)
            }
        for (int j = 0; j < G; j++) {
            float *a = acc + j * hd * 16;
            if (s0 + ns > first) /* the span reaches the diagonal: masked */
                softmax_span(p, pw, s0, ns, steps * 16, pos, 1, c, &m[j], &sum[j], a, hd, G, j);
            else
                softmax_span(p, pw, s0, ns, steps * 16, pos, 0, c, &m[j], &sum[j], a, hd, G, j);
            for (int64_t c0 = 0; c0 < hd; c0 += 64) { /* acc += V^T x weights, 64 dims */
                OUTPUTS_LOAD(0) OUTPUTS_LOAD(1) OUTPUTS_LOAD(2) OUTPUTS_LOAD(3)
                for (int64_t s = 0; s < steps; s++) {
                    _tile_loadd(5, pw + (16 * s * G + j) * 16, G * 64);
                    OUTPUTS(0) OUTPUTS(1) OUTPUTS(2) OUTPUTS(3)
                }
                OUTPUTS_STORE(0) OUTPUTS_STORE(1) OUTPUTS_STORE(2) OUTPUTS_STORE(3)
            }
        }
    }
    for (int j = 0; j < G; j++) { /* acc (hd, 16 tokens) over the sums, transposed to rows */
        const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), sum[j]);
        for (int64_t c = 0; c < hd; c += 16) {
            __m512i r[16];
            for (int d = 0; d < 16; d++)
                r[d] = (__m512i)_mm512_mul_ps(inv, _mm512_load_ps(acc + (j * hd + c + d) * 16));
            transpose16(r); /* r[qi]: dims c..c+15 of token qi */
            for (int64_t qi = 0; qi < qn; qi++)
                _mm512_storeu_si512(C_->out + (i0 + qi) * ld + (h * G + j) * hd + c, r[qi]);
        }
    }
}

/* One function per head layout (head_cases.h), each with its own stack frame (inlined into one
 * switch, the 16 layouts' arrays added up to 1.1 MB of stack; the largest alone is 145 KB). */
#define ITEM_FN(G, C)                                                                          \
    static __attribute__((noinline)) void item_##G##_##C(const Chunk *J, const uint16_t *kc, \
                                                         const uint16_t *vt, int64_t h,      \
                                                         int64_t ti) {                       \
        tile_item(J, kc, vt, h, ti, G, C);                                                     \
    }
HEAD_CASES(ITEM_FN, 4, 8)
#undef ITEM_FN

#define ITEM_CASE(G, C) \
    case (G) * 16 + (C): item_##G##_##C(J, kc, vt, h, ti); return;

static void item(const Chunk *J, const uint16_t *kc, const uint16_t *vt, int64_t h, int64_t ti) {
    switch (J->nh / J->nkv * 16 + J->hd / 16) { HEAD_CASES(ITEM_CASE, 4, 8) }
}

int paged_prefill_amx(const float *q, int64_t ldq, const void *k, const void *v,
                      const uint16_t *k_scale, const uint16_t *v_scale, int dtype,
                      const int64_t *table, int64_t start, int64_t n, int64_t nh, int64_t nkv,
                      int64_t hd, int64_t num_blocks, int64_t bs, float scale, float *out,
                      int threads) {
    if (small_gemm_bf16_amx_rows(-1) == 0) return 2; /* AMX off, not built or not granted */
    if (dtype != BF16 && dtype != I8 && dtype != FP8) return 2;
    const Cache kv = {k, v, k_scale, v_scale, dtype};
    if (n <= 0) return 0;
    const int64_t L = start + n, Lp = (L + 31) / 32 * 32, head = Lp * hd * 2; /* elements */
    int64_t per_pass = LAYOUT_BYTES / (head * 2);
    per_pass = per_pass < 1 ? 1 : per_pass > nkv ? nkv : per_pass;
    uint16_t *scratch = aligned_alloc(64, (size_t)(per_pass * head) * 2);
    if (!scratch) return 1;
    const Chunk J = {q, ldq, start, n, nh, nkv, hd, scale, out};
    const int64_t tiles = (n + QT - 1) / QT, groups = Lp / 32;
#pragma omp parallel num_threads(threads < 1 ? 1 : threads)
    {
        amx_configure();
        for (int64_t h0 = 0; h0 < nkv; h0 += per_pass) {
            const int64_t heads = nkv - h0 < per_pass ? nkv - h0 : per_pass;
#pragma omp for schedule(static)
            for (int64_t i = 0; i < heads * groups; i++) {
                uint16_t *kc = scratch + (i / groups) * head;
                lay_out(&kv, table, bs, hd, (h0 + i / groups) * num_blocks * bs * hd, L,
                        i % groups * 32, kc, kc + Lp * hd);
            }
            /* the last tiles see the most keys: they go first, and dynamic scheduling balances */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < heads * tiles; i++) {
                const uint16_t *kc = scratch + (i % heads) * head;
                item(&J, kc, kc + Lp * hd, h0 + i % heads, tiles - 1 - i / heads);
            }
        }
        _tile_release();
    }
    free(scratch);
    return 0;
}

#else

int paged_prefill_amx(const float *q, int64_t ldq, const void *k, const void *v,
                      const uint16_t *k_scale, const uint16_t *v_scale, int dtype,
                      const int64_t *table, int64_t start, int64_t n, int64_t nh, int64_t nkv,
                      int64_t hd, int64_t num_blocks, int64_t bs, float scale, float *out,
                      int threads) {
    (void)q, (void)ldq, (void)k, (void)v, (void)k_scale, (void)v_scale, (void)dtype, (void)table;
    (void)start, (void)n, (void)nh, (void)nkv, (void)hd;
    (void)num_blocks, (void)bs, (void)scale, (void)out, (void)threads;
    return 2;
}

#endif
