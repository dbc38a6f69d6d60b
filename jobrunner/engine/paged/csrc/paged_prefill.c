/* Prefill attention straight from the paged KV cache, for CPUs.
 *
 * One sequence's chunk of n query tokens at positions start..start+n-1, whose K/V rows are
 * already written to the cache: query i attends causally to positions 0..start+i through the
 * block table, cached context and its own chunk alike, with no gather copy and no mask tensor.
 *
 * Work is split over (kv head, tile of 16 query tokens) items, the tiles with the most keys first.
 * An item holds its G query heads' 16 tokens transposed, so 16 tokens of one head are one
 * vector: a score is a broadcast K value times a query vector (no horizontal sums), the online
 * softmax runs lane-wise, and the causal mask is one lane mask per key. Scores, the softmax and
 * the outputs are float32; the cache may be any format kv_load.h reads.
 *
 * Against torch's flash attention for CPU (SDPA, causal, GQA) on SmolLM2's heads (9 query heads
 * on 3 KV heads, head dim 64, 2 cores), a chunk from position 0: 512 tokens 3.1 -> 1.5 ms, 1,000
 * tokens 8.5 -> 5.2 ms, 2,142 tokens 30 -> 23 ms (205-232 GFLOP/s); bench (a)'s prefill attention
 * 5.1 -> 2.6 s. The score accumulators must be a fixed-size array: as a variable-length one they
 * lived on the stack and the score pass ran at half the speed.
 * Over a bfloat16 cache on AVX-512 BF16 (tile_bf16) both products run on vdpbf16ps, two head
 * dims (scores) or two keys (the V sum) an instruction: the queries and the softmax weights are
 * rounded to bfloat16, scores, sums and outputs stay float32. Zen 4, SmolLM2's heads, from
 * position 0, against the float32 path over a float32 cache: 2 threads 256 tokens 0.57 -> 0.44
 * ms, 1,000 tokens 6.97 -> 4.63 ms, 2,142 tokens 28.7 -> 18.3 ms (184 -> 289 GFLOP/s).
 * With AVX2 a tile is 8 query tokens (one 8-float vector), the rest as above. Without AVX-512
 * or AVX2, or a head layout it does not specialise, paged_prefill() returns 2 and the caller
 * keeps its torch path.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_pairs.h"
#include "head_cases.h"
#include "kv_load.h"
#include "prefill_tile.h"
#include "vexp.h"

int paged_prefill_amx(const float *q, int64_t ldq, const void *k, const void *v,
                      const uint16_t *k_scale, const uint16_t *v_scale, int dtype,
                      const int64_t *table, int64_t start, int64_t n, int64_t nh, int64_t nkv,
                      int64_t hd, int64_t num_blocks, int64_t bs, float scale, float *out,
                      int threads);

typedef struct {
    const float *q; /* (n, nh, hd), row stride ldq floats */
    int64_t ldq;
    const void *k, *v; /* (nkv, num_blocks, bs, hd) */
    const uint16_t *k_scale, *v_scale; /* (nkv, num_blocks, bs) float16 for I8 / FP8, else NULL */
    int dtype;
    const int64_t *table; /* block ids of positions 0..start+n-1 */
    int64_t start, n, nh, nkv, hd, num_blocks, bs;
    float scale;
    float *out; /* (n, nh, hd) */
} Chunk;

#if defined(JR_AVX512) || defined(JR_AVX2)

/* Cache offsets (in elements) of keys t0..t0+n-1 of one head (one division per call). */
static inline void key_offsets(const Chunk *J, int64_t head_base, int64_t t0, int64_t n,
                               int64_t *off) {
    int64_t blk = t0 / J->bs, pos = t0 % J->bs;
    for (int64_t t = 0; t < n; t++) {
        off[t] = head_base + (J->table[blk] * J->bs + pos) * J->hd;
        if (++pos == J->bs) pos = 0, blk++;
    }
}
#endif

#if defined(JR_AVX512)

enum { QT = 16, KSPAN = 64 }; /* query tokens per tile; keys per online-softmax update */

/* The online softmax over a span's ns keys, lane-wise for the G heads' 16 tokens: scores p (key,
 * G, 16) become weights in place, the running max m and sum grow, and the outputs acc (G, 16
 * tokens, hd) are rescaled to the new max. The scores are in natural-log units, masked ones
 * -inf, and exp_neg16 (about 1 ulp) makes the weights; or, with `log2` (tile_bf16, whose weights
 * are rounded to bfloat16 next), in log2 units, masked ones PREFILL_MASKED (prefill_tile.h), and
 * exp2_16 does (3e-6 relative; 7 instructions against 12, and no mask). */
static inline __attribute__((always_inline)) void softmax_span(float *p, int64_t ns, __m512 *m,
                                                               __m512 *sum, float *acc, const int G,
                                                               const int C, const int log2) {
    const int64_t hd = 16 * C;
    for (int j = 0; j < G; j++) {
        __m512 mx = m[j];
        for (int64_t t = 0; t < ns; t++)
            mx = _mm512_max_ps(mx, _mm512_load_ps(p + (t * G + j) * 16));
        /* every lane sees key 0, so after the first span no lane's max is masked; a lane whose
         * max stays keeps alpha 1 exactly (exp2_16(0) is 1 + 2.5e-6) */
        const __mmask16 moved = _mm512_cmp_ps_mask(mx, m[j], _CMP_NEQ_OQ);
        const __m512 alpha =
            log2 ? _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), moved,
                                      exp2_16(_mm512_sub_ps(m[j], mx)))
                 : exp_neg16(_mm512_sub_ps(m[j], mx));
        __m512 e_sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < ns; t++) {
            float *pt = p + (t * G + j) * 16;
            const __m512 x = _mm512_load_ps(pt);
            __m512 e;
            if (log2) {
                e = exp2_16(_mm512_sub_ps(x, mx));
            } else {
                const __mmask16 live =
                    _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
                e = _mm512_maskz_mov_ps(live, exp_neg16(_mm512_sub_ps(x, mx)));
            }
            e_sum = _mm512_add_ps(e_sum, e);
            _mm512_store_ps(pt, e);
        }
        sum[j] = _mm512_fmadd_ps(sum[j], alpha, e_sum);
        m[j] = mx;
        if (!moved) continue; /* no lane's max moved: the outputs stay as they are */
        float al[16] __attribute__((aligned(64)));
        _mm512_store_ps(al, alpha);
        for (int64_t qi = 0; qi < QT; qi++) { /* the outputs rescaled to the new max */
            const __m512 f = _mm512_set1_ps(al[qi]);
            float *o = acc + (j * 16 + qi) * hd;
            for (int c = 0; c < C; c++)
                _mm512_store_ps(o + 16 * c, _mm512_mul_ps(f, _mm512_load_ps(o + 16 * c)));
        }
    }
}

/* Keys a score block takes, TB: its TB * G accumulators (at most 24), the G query vectors and a
 * broadcast key in 32 registers; TB divides 16. */
static inline int score_keys(const int G) { return G == 1 ? 16 : G <= 3 ? 8 : G <= 6 ? 4 : 2; }

/* TB keys' scores a[b * G + j] (keys t0.., of which `live_keys` are real) times the scale, into
 * p (key, G, 16 tokens); causal: a lane whose position is before key t gets `masked` (-inf, or
 * PREFILL_MASKED), as does every lane of a key past the real ones. */
static inline __attribute__((always_inline)) void store_scores(float *p, const __m512 *a,
                                                               __m512i pos, __m512 sc, int64_t t0,
                                                               int64_t live_keys, const int TB,
                                                               const int G, const float masked) {
#pragma GCC unroll 16
    for (int b = 0; b < TB; b++) {
        const __mmask16 live =
            b < live_keys
                ? _mm512_cmp_epi32_mask(pos, _mm512_set1_epi32((int)(t0 + b)), _MM_CMPINT_NLT)
                : 0;
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            _mm512_store_ps(p + (b * G + j) * 16,
                            _mm512_mask_mul_ps(_mm512_set1_ps(masked), live, a[b * G + j], sc));
    }
}

typedef uint32_t word32 __attribute__((may_alias)); /* a float, or a pair of bfloat16 */

/* One multiply-add of a score block: a float32 FMA of a broadcast key value and 16 tokens'
 * query values, or (bf) a vdpbf16ps of a broadcast key pair and 16 tokens' query pairs. */
static inline __attribute__((always_inline)) __m512 score_mac(__m512 a, __m512i k, __m512i q,
                                                              const int bf) {
#if defined(__AVX512BF16__)
    if (bf) return _mm512_dpbf16_ps(a, (__m512bh)k, (__m512bh)q);
#endif
    return _mm512_fmadd_ps(_mm512_castsi512_ps(k), _mm512_castsi512_ps(q), a);
}

/* The scores of TB keys (krow: float32 rows, or bf rows of bfloat16 pairs) against the tile's G
 * heads' queries qt ((steps, G, 16 tokens) words: head dims, or bf pairs of them), TB * G
 * accumulators held over the steps, into p as store_scores() writes them (masked lanes -inf, or
 * bf PREFILL_MASKED: the bf path's scores are in log2 units). */
static inline __attribute__((always_inline)) void score_block(
    const word32 *qt, const word32 *const *krow, int64_t steps, float *p, __m512i pos, __m512 sc,
    int64_t t0, int64_t live_keys, const int TB, const int G, const int bf) {
    __m512 a[24];
    __m512i qv[8];
#pragma GCC unroll 24
    for (int i = 0; i < TB * G; i++) a[i] = _mm512_setzero_ps();
    for (int64_t e = 0; e < steps; e++) {
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) qv[j] = _mm512_load_si512(qt + (e * G + j) * 16);
#pragma GCC unroll 16
        for (int b = 0; b < TB; b++) {
            const __m512i kb = _mm512_set1_epi32((int)krow[b][e]);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) a[b * G + j] = score_mac(a[b * G + j], kb, qv[j], bf);
        }
    }
    store_scores(p, a, pos, sc, t0, live_keys, TB, G, bf ? PREFILL_MASKED : -INFINITY);
}

/* score_block with score_keys(G) keys, in a function of its own: in tile_bf16, GCC kept the
 * softmax's constants in registers across the score loop and spilled accumulators to the stack
 * every pair (5 of 24 with all layouts inlined into one switch, 1 in a layout's own function:
 * head_cases.h). */
static __attribute__((noinline)) void scores(const word32 *qt, const word32 *const *krow,
                                             int64_t steps, float *p, __m512i pos, __m512 sc,
                                             int64_t t0, int64_t live_keys, int G, int bf) {
    switch (G) {
#define SCORES(g) \
    case g: \
        if (bf) score_block(qt, krow, steps, p, pos, sc, t0, live_keys, score_keys(g), g, 1); \
        else score_block(qt, krow, steps, p, pos, sc, t0, live_keys, score_keys(g), g, 0); \
        return;
        SCORES(1) SCORES(2) SCORES(3) SCORES(4) SCORES(5) SCORES(6) SCORES(7) SCORES(8)
#undef SCORES
    }
}

/* The tile's qn real tokens' outputs: acc over each head's softmax sum, into J->out. */
static inline __attribute__((always_inline)) void store_outputs(const Chunk *J, const float *acc,
                                                                const __m512 *sum, int64_t i0,
                                                                int64_t qn, int64_t h, const int G,
                                                                const int C) {
    const int64_t hd = 16 * C, ld = J->nh * hd;
    for (int j = 0; j < G; j++) {
        float inv[16] __attribute__((aligned(64)));
        _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sum[j]));
        for (int64_t qi = 0; qi < qn; qi++) {
            float *o = J->out + (i0 + qi) * ld + (h * G + j) * hd;
            const float *a = acc + (j * 16 + qi) * hd;
            for (int c = 0; c < C; c++)
                _mm512_storeu_ps(
                    o + 16 * c, _mm512_mul_ps(_mm512_set1_ps(inv[qi]), _mm512_load_ps(a + 16 * c)));
        }
    }
}

/* Keys at off[0..nt-1] as float32 rows: in place for a float32 cache, else converted (times
 * their scale) into kbuf. Rows past nt repeat the first (a real row; masked later). */
static inline void key_rows(const Chunk *J, const int64_t *offs, int64_t nt, float *kbuf,
                            const word32 **krow, const int C) {
    const int64_t hd = 16 * C;
    for (int64_t tt = 0; tt < 16; tt++) {
        const int64_t off = offs[tt < nt ? tt : 0];
        if (J->dtype == F32) {
            krow[tt] = (const word32 *)((const float *)J->k + off);
            continue;
        }
        const __m512 f = _mm512_set1_ps(code_scale(J->dtype, J->k_scale, off, hd));
        for (int c = 0; c < C; c++)
            _mm512_store_ps(kbuf + tt * hd + 16 * c,
                            _mm512_mul_ps(f, load16(J->k, J->dtype, off + 16 * c)));
        krow[tt] = (const word32 *)(kbuf + tt * hd);
    }
}

/* One (kv head h, query tile ti) item with G query heads and head_dim 16 * C. */
static inline __attribute__((always_inline)) void tile_avx512(const Chunk *J, int64_t h, int64_t ti,
                                                              const int G, const int C) {
    const int64_t hd = 16 * C, i0 = ti * QT, qn = J->n - i0 < QT ? J->n - i0 : QT;
    const int64_t L = J->start + i0 + qn; /* keys the tile's last query sees */
    const int64_t head_base = h * J->num_blocks * J->bs * hd, ld = J->nh * hd;
    const int TB = score_keys(G);
    float qt[16 * C * G * 16] __attribute__((aligned(64))); /* (hd, G, 16 tokens) */
    float acc[G * 16 * 16 * C] __attribute__((aligned(64))); /* (G, 16 tokens, hd) */
    float p[KSPAN * G * 16] __attribute__((aligned(64))); /* (key, G, 16 tokens) */
    float kbuf[16 * 16 * C] __attribute__((aligned(64)));
    int64_t offs[KSPAN];
    const word32 *krow[16];
    __m512 m[G], sum[G];
    for (int64_t d = 0; d < hd; d++)
        for (int j = 0; j < G; j++)
            for (int64_t qi = 0; qi < QT; qi++)
                qt[(d * G + j) * 16 + qi] =
                    qi < qn ? J->q[(i0 + qi) * J->ldq + (h * G + j) * hd + d] : 0.0f;
    memset(acc, 0, sizeof(acc));
    for (int j = 0; j < G; j++) m[j] = _mm512_set1_ps(-INFINITY), sum[j] = _mm512_setzero_ps();
    const __m512i pos = lane_positions(J->start + i0, L);
    const __m512 sc = _mm512_set1_ps(J->scale);
    for (int64_t s0 = 0; s0 < L; s0 += KSPAN) {
        const int64_t ns = L - s0 < KSPAN ? L - s0 : KSPAN;
        key_offsets(J, head_base, s0, ns, offs);
        for (int64_t c0 = 0; c0 < ns; c0 += 16) { /* scores of 16 keys, TB at a time */
            const int64_t nt = ns - c0 < 16 ? ns - c0 : 16;
            key_rows(J, offs + c0, nt, kbuf, krow, C);
            for (int64_t b0 = 0; b0 < 16; b0 += TB)
                scores((const word32 *)qt, krow + b0, hd,
                       p + (c0 + b0) * G * 16, pos, sc, s0 + c0 + b0, nt - b0, G, 0);
        }
        softmax_span(p, ns, m, sum, acc, G, C, 0);
        if (J->dtype == I8 || J->dtype == FP8) /* a V row's scale, folded into its weights */
            for (int64_t t = 0; t < ns; t++) {
                const __m512 f = _mm512_set1_ps(code_scale(J->dtype, J->v_scale, offs[t], hd));
                for (int j = 0; j < G; j++) {
                    float *pt = p + (t * G + j) * 16;
                    _mm512_store_ps(pt, _mm512_mul_ps(f, _mm512_load_ps(pt)));
                }
            }
        for (int64_t r0 = 0; r0 < G * 16; r0 += 4) { /* acc += weights x V, 4 rows x 4 vectors */
            const int j = (int)(r0 / 16);
            for (int cb = 0; cb < C; cb += 4) {
                __m512 a[4][4];
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 4; c++)
                        a[r][c] = _mm512_load_ps(acc + (r0 + r) * hd + 16 * (cb + c));
                for (int64_t t = 0; t < ns; t++) {
                    __m512 v[4];
                    for (int c = 0; c < 4; c++)
                        v[c] = load16(J->v, J->dtype, offs[t] + 16 * (cb + c));
                    const float *pt = p + (t * G + j) * 16 + r0 % 16;
                    for (int r = 0; r < 4; r++) {
                        const __m512 w = _mm512_set1_ps(pt[r]);
                        for (int c = 0; c < 4; c++) a[r][c] = _mm512_fmadd_ps(w, v[c], a[r][c]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 4; c++)
                        _mm512_store_ps(acc + (r0 + r) * hd + 16 * (cb + c), a[r][c]);
            }
        }
    }
    store_outputs(J, acc, sum, i0, qn, h, G, C);
}

#if defined(__AVX512BF16__)
/* The tile's queries for tile_bf16, qt (hd/2 pairs, G, 16 tokens): each token's pairs of head
 * dims rounded to bfloat16 (to the nearest even, as torch's .to(bfloat16)) 16 pairs at a time,
 * then 16 tokens' words transposed in registers; tokens past qn are zero. (Word by word in
 * scalar code this took a fifth to a third of a 128-token chunk's attention on Zen 4.) */
static inline __attribute__((always_inline)) void query_pairs(const Chunk *J, int64_t i0,
                                                              int64_t qn, int64_t h, uint32_t *qt,
                                                              const int G, const int C) {
    const int64_t hd = 16 * C;
    for (int j = 0; j < G; j++)
        for (int64_t blk = 0; blk < C / 2; blk++) { /* pairs 16 blk .. 16 blk + 15 */
            __m512i r[16];
            for (int64_t qi = 0; qi < QT; qi++) {
                const float *qr = J->q + (i0 + qi) * J->ldq + (h * G + j) * hd + 32 * blk;
                r[qi] = qi < qn ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qr + 16),
                                                               _mm512_loadu_ps(qr))
                                : _mm512_setzero_si512(); /* word e: dims (2e, 2e + 1) */
            }
            transpose16(r);
            for (int e = 0; e < 16; e++)
                _mm512_store_si512(qt + ((16 * blk + e) * G + j) * 16, r[e]);
        }
}

/* tile_avx512 for a bfloat16 cache on AVX-512 BF16: the queries rounded to bfloat16 and held as
 * pairs of head dims, so one vdpbf16ps adds two dims of 16 tokens' scores against a broadcast
 * key pair read from the cache as it is; the softmax weights rounded to bfloat16 and paired
 * over keys (t, t+1), against V rows interleaved the same way once a span, so the weighted V sum
 * also does two keys an instruction. Scores, the softmax, its sums and the outputs stay float32. */
static inline __attribute__((always_inline)) void tile_bf16(const Chunk *J, int64_t h, int64_t ti,
                                                            const int G, const int C) {
    const int64_t hd = 16 * C, hp = 8 * C, i0 = ti * QT, qn = J->n - i0 < QT ? J->n - i0 : QT;
    const int64_t L = J->start + i0 + qn; /* keys the tile's last query sees */
    const int64_t head_base = h * J->num_blocks * J->bs * hd, ld = J->nh * hd;
    const int TB = score_keys(G);
    const uint16_t *kc = J->k, *vc = J->v;
    uint32_t qt[8 * C * G * 16] __attribute__((aligned(64))); /* (hd/2 pairs, G, 16 tokens) */
    float acc[G * 16 * 16 * C] __attribute__((aligned(64))); /* (G, 16 tokens, hd) */
    float p[KSPAN * G * 16] __attribute__((aligned(64))); /* (key, G, 16 tokens) */
    uint32_t pw[KSPAN / 2 * G * 16] __attribute__((aligned(64))); /* (key pair, G, 16 tokens) */
    uint32_t vp[KSPAN / 2 * 16 * C] __attribute__((aligned(64))); /* (key pair, hd) */
    int64_t offs[KSPAN];
    const word32 *krow[16];
    __m512 m[G], sum[G];
    query_pairs(J, i0, qn, h, qt, G, C);
    memset(acc, 0, sizeof(acc));
    for (int j = 0; j < G; j++) m[j] = _mm512_set1_ps(PREFILL_MASKED), sum[j] = _mm512_setzero_ps();
    const __m512i pos = lane_positions(J->start + i0, L);
    const __m512 sc = _mm512_set1_ps(J->scale * EXP_LOG2E); /* log2 units */
    for (int64_t s0 = 0; s0 < L; s0 += KSPAN) {
        const int64_t ns = L - s0 < KSPAN ? L - s0 : KSPAN, np = (ns + 1) / 2;
        key_offsets(J, head_base, s0, ns, offs);
        for (int64_t c0 = 0; c0 < ns; c0 += 16) { /* scores of 16 keys, TB at a time */
            const int64_t nt = ns - c0 < 16 ? ns - c0 : 16;
            for (int64_t tt = 0; tt < 16; tt++) /* rows past nt repeat the first (masked) */
                krow[tt] = (const word32 *)(kc + offs[c0 + (tt < nt ? tt : 0)]);
            for (int64_t b0 = 0; b0 < 16; b0 += TB)
                scores((const word32 *)qt, krow + b0, hp,
                       p + (c0 + b0) * G * 16, pos, sc, s0 + c0 + b0, nt - b0, G, 1);
        }
        softmax_span(p, ns, m, sum, acc, G, C, 1);
        for (int64_t tp = 0; tp < np; tp++) { /* weights and V rows as key pairs (t, t+1) */
            const int64_t t0 = 2 * tp, t1 = t0 + 1 < ns ? t0 + 1 : -1; /* an odd tail: weight 0 */
            for (int j = 0; j < G; j++) {
                const __m512 lo = _mm512_load_ps(p + (t0 * G + j) * 16);
                const __m512 hi = t1 >= 0 ? _mm512_load_ps(p + (t1 * G + j) * 16)
                                          : _mm512_setzero_ps();
                _mm512_store_si512(pw + (tp * G + j) * 16, pairs_of(lo, hi));
            }
            const uint16_t *v0 = vc + offs[t0], *v1 = t1 >= 0 ? vc + offs[t1] : v0;
            for (int c = 0; c < C; c++)
                _mm512_store_si512(vp + tp * hd + 16 * c, row_pairs(v0 + 16 * c, v1 + 16 * c));
        }
        for (int64_t r0 = 0; r0 < G * 16; r0 += 4) { /* acc += weights x V, 4 rows x 4 vectors */
            const int j = (int)(r0 / 16);
            for (int cb = 0; cb < C; cb += 4) {
                __m512 a[4][4];
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 4; c++)
                        a[r][c] = _mm512_load_ps(acc + (r0 + r) * hd + 16 * (cb + c));
                for (int64_t tp = 0; tp < np; tp++) {
                    __m512bh v[4];
                    for (int c = 0; c < 4; c++)
                        v[c] = (__m512bh)_mm512_load_si512(vp + tp * hd + 16 * (cb + c));
                    const uint32_t *pt = pw + (tp * G + j) * 16 + r0 % 16;
                    for (int r = 0; r < 4; r++) {
                        const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pt[r]);
                        for (int c = 0; c < 4; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], w, v[c]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 4; c++)
                        _mm512_store_ps(acc + (r0 + r) * hd + 16 * (cb + c), a[r][c]);
            }
        }
    }
    store_outputs(J, acc, sum, i0, qn, h, G, C);
}

#define TILE_FN(G, C) /* a function per layout: head_cases.h */ \
    static __attribute__((noinline)) void tile_##G##_##C##_bf16(const Chunk *J, int64_t h, \
                                                               int64_t ti) { \
        tile_bf16(J, h, ti, G, C); \
    }
HEAD_CASES(TILE_FN, 4, 8)
#undef TILE_FN
#define TILE_BF16(G, C) \
    case (G) * 16 + (C): tile_##G##_##C##_bf16(J, h, ti); return;
#else
#define TILE_BF16(G, C)
#endif

#define TILE_FN(G, C) /* a function per layout: head_cases.h */ \
    static __attribute__((noinline)) void tile_##G##_##C(const Chunk *J, int64_t h, int64_t ti) { \
        tile_avx512(J, h, ti, G, C); \
    }
HEAD_CASES(TILE_FN, 4, 8)
#undef TILE_FN
#define TILE_CASE(G, C) \
    case (G) * 16 + (C): tile_##G##_##C(J, h, ti); return;

static void tile_item(const Chunk *J, int64_t h, int64_t ti) {
    if (J->dtype == BF16)
        switch (J->nh / J->nkv * 16 + J->hd / 16) { HEAD_CASES(TILE_BF16, 4, 8) }
    switch (J->nh / J->nkv * 16 + J->hd / 16) { HEAD_CASES(TILE_CASE, 4, 8) }
}

#elif defined(JR_AVX2)

enum { QT = 8, KSPAN = 64 }; /* query tokens per tile; keys per online-softmax update */

/* key_rows with 8-float vectors (head_dim 8 * C). */
static inline void key_rows8(const Chunk *J, const int64_t *offs, int64_t nt, float *kbuf,
                             const float **krow, const int C) {
    const int64_t hd = 8 * C;
    for (int64_t tt = 0; tt < 16; tt++) {
        const int64_t off = offs[tt < nt ? tt : 0];
        if (J->dtype == F32) {
            krow[tt] = (const float *)J->k + off;
            continue;
        }
        const __m256 f = _mm256_set1_ps(code_scale(J->dtype, J->k_scale, off, hd));
        for (int c = 0; c < C; c++)
            _mm256_store_ps(kbuf + tt * hd + 8 * c,
                            _mm256_mul_ps(f, load8(J->k, J->dtype, off + 8 * c)));
        krow[tt] = kbuf + tt * hd;
    }
}

/* tile_avx512 with 8 query tokens a tile: 8 tokens of one head are one vector. TB keys' scores
 * for the G heads (TB * G accumulators), the G query vectors and a broadcast fit 16 registers;
 * the V pass holds 4 query rows x 2 vectors of head_dim. */
static inline __attribute__((always_inline)) void tile_avx2(const Chunk *J, int64_t h, int64_t ti,
                                                            const int G, const int C) {
    const int64_t hd = 8 * C, i0 = ti * QT, qn = J->n - i0 < QT ? J->n - i0 : QT;
    const int64_t L = J->start + i0 + qn; /* keys the tile's last query sees */
    const int64_t head_base = h * J->num_blocks * J->bs * hd, ld = J->nh * hd;
    const int TB = G == 1 ? 8 : G <= 3 ? 4 : G <= 5 ? 2 : 1; /* keys a score block */
    float qt[8 * C * G * 8] __attribute__((aligned(32))); /* (hd, G, 8 tokens) */
    float acc[G * 8 * 8 * C] __attribute__((aligned(32))); /* (G, 8 tokens, hd) */
    float p[KSPAN * G * 8] __attribute__((aligned(32))); /* (key, G, 8 tokens) */
    float kbuf[16 * 8 * C] __attribute__((aligned(32)));
    int64_t offs[KSPAN];
    const float *krow[16];
    __m256 m[G], sum[G];
    for (int64_t d = 0; d < hd; d++)
        for (int j = 0; j < G; j++)
            for (int64_t qi = 0; qi < QT; qi++)
                qt[(d * G + j) * 8 + qi] =
                    qi < qn ? J->q[(i0 + qi) * J->ldq + (h * G + j) * hd + d] : 0.0f;
    memset(acc, 0, sizeof(acc));
    for (int j = 0; j < G; j++) m[j] = _mm256_set1_ps(-INFINITY), sum[j] = _mm256_setzero_ps();
    /* lane qi's position; padding lanes take the last real one (their output is not stored) */
    __m256i pos = _mm256_add_epi32(_mm256_set1_epi32((int)(J->start + i0)),
                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    pos = _mm256_min_epi32(pos, _mm256_set1_epi32((int)(L - 1)));
    const __m256 sc = _mm256_set1_ps(J->scale), neg_inf = _mm256_set1_ps(-INFINITY);
    for (int64_t s0 = 0; s0 < L; s0 += KSPAN) {
        const int64_t ns = L - s0 < KSPAN ? L - s0 : KSPAN;
        key_offsets(J, head_base, s0, ns, offs);
        for (int64_t c0 = 0; c0 < ns; c0 += 16) { /* scores of 16 keys, TB at a time */
            const int64_t nt = ns - c0 < 16 ? ns - c0 : 16;
            key_rows8(J, offs + c0, nt, kbuf, krow, C);
            for (int64_t b0 = 0; b0 < 16; b0 += TB) {
                __m256 a[12], qv[8]; /* TB * G <= 12 in registers: the loops are unrolled */
#pragma GCC unroll 12
                for (int i = 0; i < TB * G; i++) a[i] = _mm256_setzero_ps();
                for (int64_t d = 0; d < hd; d++) {
#pragma GCC unroll 8
                    for (int j = 0; j < G; j++) qv[j] = _mm256_load_ps(qt + (d * G + j) * 8);
#pragma GCC unroll 8
                    for (int b = 0; b < TB; b++) {
                        const __m256 kb = _mm256_broadcast_ss(krow[b0 + b] + d);
#pragma GCC unroll 8
                        for (int j = 0; j < G; j++)
                            a[b * G + j] = _mm256_fmadd_ps(kb, qv[j], a[b * G + j]);
                    }
                }
#pragma GCC unroll 8
                for (int b = 0; b < TB; b++) {
                    const int64_t t = s0 + c0 + b0 + b;
                    /* causal: lanes whose position is not before key t; keys past L: none */
                    const __m256 live =
                        b0 + b < nt ? _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                          pos, _mm256_set1_epi32((int)t - 1)))
                                    : _mm256_setzero_ps();
#pragma GCC unroll 8
                    for (int j = 0; j < G; j++)
                        _mm256_store_ps(p + ((c0 + b0 + b) * G + j) * 8,
                                        _mm256_blendv_ps(neg_inf, _mm256_mul_ps(a[b * G + j], sc),
                                                         live));
                }
            }
        }
        for (int j = 0; j < G; j++) { /* online softmax, lane-wise over the span's keys */
            __m256 mx = m[j];
            for (int64_t t = 0; t < ns; t++)
                mx = _mm256_max_ps(mx, _mm256_load_ps(p + (t * G + j) * 8));
            /* every lane sees key 0, so after the first span no lane's max is -inf */
            const __m256 alpha = exp_neg8(_mm256_sub_ps(m[j], mx));
            __m256 e_sum = _mm256_setzero_ps();
            for (int64_t t = 0; t < ns; t++) {
                float *pt = p + (t * G + j) * 8;
                const __m256 x = _mm256_load_ps(pt);
                const __m256 live = _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_OQ);
                const __m256 e = _mm256_and_ps(live, exp_neg8(_mm256_sub_ps(x, mx)));
                e_sum = _mm256_add_ps(e_sum, e);
                _mm256_store_ps(pt, e);
            }
            sum[j] = _mm256_fmadd_ps(sum[j], alpha, e_sum);
            m[j] = mx;
            float al[8] __attribute__((aligned(32)));
            _mm256_store_ps(al, alpha);
            for (int64_t qi = 0; qi < QT; qi++) { /* the outputs rescaled to the new max */
                const __m256 f = _mm256_set1_ps(al[qi]);
                float *o = acc + (j * 8 + qi) * hd;
                for (int c = 0; c < C; c++)
                    _mm256_store_ps(o + 8 * c, _mm256_mul_ps(f, _mm256_load_ps(o + 8 * c)));
            }
        }
        if (J->dtype == I8 || J->dtype == FP8) /* a V row's scale, folded into its weights */
            for (int64_t t = 0; t < ns; t++) {
                const __m256 f = _mm256_set1_ps(code_scale(J->dtype, J->v_scale, offs[t], hd));
                for (int j = 0; j < G; j++) {
                    float *pt = p + (t * G + j) * 8;
                    _mm256_store_ps(pt, _mm256_mul_ps(f, _mm256_load_ps(pt)));
                }
            }
        for (int64_t r0 = 0; r0 < G * 8; r0 += 4) { /* acc += weights x V, 4 rows x 2 vectors */
            const int j = (int)(r0 / 8);
            for (int cb = 0; cb < C; cb += 2) {
                __m256 a[4][2];
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 2; c++)
                        a[r][c] = _mm256_load_ps(acc + (r0 + r) * hd + 8 * (cb + c));
                for (int64_t t = 0; t < ns; t++) {
                    __m256 v[2];
                    for (int c = 0; c < 2; c++)
                        v[c] = load8(J->v, J->dtype, offs[t] + 8 * (cb + c));
                    const float *pt = p + (t * G + j) * 8 + r0 % 8;
                    for (int r = 0; r < 4; r++) {
                        const __m256 w = _mm256_broadcast_ss(pt + r);
                        for (int c = 0; c < 2; c++) a[r][c] = _mm256_fmadd_ps(w, v[c], a[r][c]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int c = 0; c < 2; c++)
                        _mm256_store_ps(acc + (r0 + r) * hd + 8 * (cb + c), a[r][c]);
            }
        }
    }
    for (int j = 0; j < G; j++) {
        float inv[8] __attribute__((aligned(32)));
        _mm256_store_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), sum[j]));
        for (int64_t qi = 0; qi < qn; qi++) {
            float *o = J->out + (i0 + qi) * ld + (h * G + j) * hd;
            const float *a = acc + (j * 8 + qi) * hd;
            for (int c = 0; c < C; c++)
                _mm256_storeu_ps(o + 8 * c,
                                 _mm256_mul_ps(_mm256_set1_ps(inv[qi]), _mm256_load_ps(a + 8 * c)));
        }
    }
}

#define TILE_FN(G, C) /* a function per layout: head_cases.h */ \
    static __attribute__((noinline)) void tile_##G##_##C(const Chunk *J, int64_t h, int64_t ti) { \
        tile_avx2(J, h, ti, G, C); \
    }
HEAD_CASES(TILE_FN, 8, 16)
#undef TILE_FN
#define TILE_CASE(G, C) \
    case (G) * 32 + (C): tile_##G##_##C(J, h, ti); return;

static void tile_item(const Chunk *J, int64_t h, int64_t ti) {
    switch (J->nh / J->nkv * 32 + J->hd / 8) { HEAD_CASES(TILE_CASE, 8, 16) }
}
#endif

#if defined(JR_AVX512) || defined(JR_AVX2)

/* 1 when paged_prefill handles this head layout (head_dim 64 or 128, up to 8 query heads per
 * KV head, positions that fit 32 bits). */
int paged_prefill_supports(int64_t nh, int64_t nkv, int64_t hd) {
    const int64_t g = nkv > 0 && nh % nkv == 0 ? nh / nkv : 0;
    return g >= 1 && g <= 8 && (hd == 64 || hd == 128);
}

/* Returns 0 on success, 2 when the layout is not supported (the caller keeps its torch path). */
int paged_prefill(const float *q, int64_t ldq, const void *k, const void *v,
                  const uint16_t *k_scale,
                  const uint16_t *v_scale, int dtype, const int64_t *table, int64_t start,
                  int64_t n, int64_t nh, int64_t nkv, int64_t hd, int64_t num_blocks, int64_t bs,
                  float scale, float *out, int threads, int tiles_8bit) {
    if (!paged_prefill_supports(nh, nkv, hd) || start + n >= INT32_MAX) return 2;
    /* AMX tiles where they are on (an 8-bit cache's rows rounded to bfloat16 on the way, when
     * the caller computes in bfloat16 anyway); else (or without memory for their layout) the
     * vector path */
    if ((dtype == BF16 || (tiles_8bit && (dtype == I8 || dtype == FP8))) &&
        paged_prefill_amx(q, ldq, k, v, k_scale, v_scale, dtype, table, start, n, nh, nkv, hd,
                          num_blocks, bs, scale, out, threads) == 0)
        return 0;
    const Chunk J = {
        q, ldq, k, v, k_scale, v_scale, dtype, table, start, n, nh, nkv, hd, num_blocks, bs, scale, out};
    const int64_t tiles = (n + QT - 1) / QT, items = tiles * nkv;
    /* the last tiles see the most keys: they go first, and dynamic scheduling balances */
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(dynamic, 1)
    for (int64_t i = 0; i < items; i++) tile_item(&J, i % nkv, tiles - 1 - i / nkv);
    return 0;
}

#else

int paged_prefill_supports(int64_t nh, int64_t nkv, int64_t hd) {
    (void)nh, (void)nkv, (void)hd;
    return 0;
}

int paged_prefill(const float *q, int64_t ldq, const void *k, const void *v,
                  const uint16_t *k_scale,
                  const uint16_t *v_scale, int dtype, const int64_t *table, int64_t start,
                  int64_t n, int64_t nh, int64_t nkv, int64_t hd, int64_t num_blocks, int64_t bs,
                  float scale, float *out, int threads, int tiles_8bit) {
    (void)q, (void)ldq, (void)k, (void)v, (void)k_scale, (void)v_scale, (void)dtype, (void)table;
    (void)start, (void)n, (void)nh, (void)nkv, (void)hd, (void)num_blocks, (void)bs, (void)scale;
    (void)out, (void)threads, (void)tiles_8bit;
    return 2;
}

#endif
