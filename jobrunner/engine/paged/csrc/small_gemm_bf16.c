/* y = x W^T + b with bfloat16 weights, on CPUs with AVX-512 BF16 (Zen 4 and 5, Cooper Lake,
 * Sapphire Rapids and later): float32 or bfloat16 x, float32 y (written, or added to a
 * residual stream), float32 accumulation; or, for a fused gate/up weight, silu(gate) * up
 * stored as bfloat16 rows for the down projection.
 *
 * The scheme of small_gemm.c with half the weight bytes and twice the arithmetic a vector
 * instruction: W (N, K) is packed once into panels of 32 output columns holding pairs of k,
 * (ceil(N/32), ceil(K/2), 32, 2) bfloat16, zero-padded, so one k pair of a panel is two 64-byte
 * vectors; x is rounded to bfloat16 a slice of rows at a time (round to nearest even, as
 * torch's .to(bfloat16); bfloat16 rows are their own pairs) into pairs, each block of rows
 * k-major, (ceil(K/2), rows), so one pointer walks a block's rows (14 row pointers spilled to
 * the stack: 7 reloads a k pair, 74% of peak at 52 rows against 83% now). Each vdpbf16ps adds,
 * for 16 columns, the products of one row's k pair with the column's pair: 32 multiply-adds
 * where a float32 FMA does 16. A block of up to 14 rows keeps its 28 accumulators in registers
 * over the whole of K; while the blocks work on a panel, each prefetches its share of the next
 * one into L2, and requests the lines of y it will write (a 1,024-row step's output is 12 MB,
 * beyond L2: its stores missed, 1 thread, 3072 x 576: 382 -> 453 GFLOP/s).
 *
 * Where the CPU has AMX tiles (small_gemm_amx.c) steps of amx_rows rows or more take them
 * instead, with the same packed weights.
 *
 * Without AVX-512 BF16, small_gemm_bf16_fast() returns 0 and bf16 models keep torch's linears.
 */
#include <stdint.h>
#include <stdlib.h>

#include "amx.h"
#include "bf16_pairs.h"
#include "layer_kernels.h"
#include "row_chunks.h"
#include "silu.h"

#define NR 32 /* output columns per panel */
#define MR 14 /* most rows per block: 28 accumulators + 2 weight vectors + 1 broadcast */
#define MR_SILU 7 /* a gate panel and its up panel: 28 accumulators, the 4 weight vectors and
                     the broadcast from memory operands (33 would not fit in 32 registers) */

int small_gemm_bf16_panel(void) { return NR; }

int small_gemm_amx(const void *x, int64_t ldx, int x_bf16, const uint16_t *w, const float *bias,
                   float *y, int64_t ldy, int add, int64_t M, int64_t N, int64_t K,
                   int threads);
int small_gemm_amx_silu(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                        const float *bias, uint16_t *y, int64_t M, int64_t N, int64_t K,
                        int threads);

/* Rows from which a step takes the AMX tiles where they are granted; 0: never. Measured on a
 * 2-core Sapphire Rapids (docs/performance.md); cpu_kernels.py may set it. */
static int64_t amx_rows = 16;

/* The AMX threshold now, after setting it to `rows` when rows >= 0; 0 when AMX is not there. */
int64_t small_gemm_bf16_amx_rows(int64_t rows) {
    if (rows >= 0) amx_rows = rows;
    return amx_ready() ? amx_rows : 0;
}

static int takes_amx(int64_t M, int64_t K) {
    return amx_rows > 0 && M >= amx_rows && K % 32 == 0 && amx_ready();
}

enum { STORE, ADD, SILU }; /* gemm_bf16: y = the linear, y += it, y = silu(gate) * up */
static int gemm_bf16(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                     const float *bias, void *y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                     int threads, int mode);

/* The three entry points below: a step that takes the AMX tiles runs every linear of its rows
 * on them, each entry point declining (3) what the tiles do not do, so the caller's fallback
 * runs on the tiles too (the vdpbf16ps kernel sums in another order, and a row's bits must not
 * depend on which entry point ran); the tiles do not load overlapping x_bf16 rows (ldx < K)
 * in place. Other steps take vdpbf16ps, or get 3 where it is not built (gemm_bf16). */

/* y (M x N/2, bfloat16) = silu(gate) * up of a fused gate/up linear (N columns, gate then up,
 * N/2 a multiple of 32), in one pass, on the AMX tiles or vdpbf16ps; x: float32 or, x_bf16,
 * bfloat16 rows. 3 where neither takes it, and the caller runs the linear and then silu_mul
 * (act_norm.c). */
int small_gemm_bf16_silu(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                         const float *bias, uint16_t *y, int64_t M, int64_t N, int64_t K,
                         int threads) {
    if (N % (2 * NR) != 0) return 3;
    if (takes_amx(M, K))
        return x_bf16 && ldx < K
                   ? 3
                   : small_gemm_amx_silu(x, ldx, x_bf16, w, bias, y, M, N, K, threads);
    return gemm_bf16(x, ldx, x_bf16, w, bias, y, N / 2, M, N, K, threads, SILU);
}

/* small_gemm_bf16() for bfloat16 rows x (the same bits as the float32 rows they were rounded
 * from): on the AMX tiles, which load them in place, or as vdpbf16ps pairs, which are their
 * words; 3 where neither kernel is built (or the tiles' rows overlap), and the caller widens
 * them to float32 (exactly). */
int small_gemm_bf16_rows(const uint16_t *x, int64_t ldx, const uint16_t *w, const float *bias,
                         float *y, int64_t M, int64_t N, int64_t K, int threads) {
    if (takes_amx(M, K)) /* rows that do not overlap (a_operand copies K each) */
        return ldx < K ? 3 : small_gemm_amx(x, ldx, 1, w, bias, y, N, 0, M, N, K, threads);
    return gemm_bf16(x, ldx, 1, w, bias, y, N, M, N, K, threads, STORE);
}

/* y (M x N, row stride ldy) += x W^T + b: each block's outputs added into y as they are made
 * (on the AMX tiles from L1; on vdpbf16ps from its registers), the same bits as the linear
 * then `y += it`, without writing the linear out or reading it back (a residual stream
 * updated in place). x: float32 or, x_bf16, bfloat16 rows. 3 where neither kernel takes it:
 * the caller runs those two. */
int small_gemm_bf16_add(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                        const float *bias, float *y, int64_t ldy, int64_t M, int64_t N,
                        int64_t K, int threads) {
    if (ldy < N) return 3;
    if (takes_amx(M, K))
        return x_bf16 && ldx < K
                   ? 3
                   : small_gemm_amx(x, ldx, x_bf16, w, bias, y, ldy, 1, M, N, K, threads);
    return gemm_bf16(x, ldx, x_bf16, w, bias, y, ldy, M, N, K, threads, ADD);
}

#if defined(JR_AVX512) && defined(__AVX512BF16__)

int small_gemm_bf16_fast(void) { return 1; }

/* A block's share of the next panel at k pair k, into L2: bpk/256 bytes per k pair. */
static inline __attribute__((always_inline)) void panel_share(const char *pf, int64_t k,
                                                              int64_t bpk) {
    const char *p = pf + ((k * bpk) >> 8);
    _mm_prefetch(p, _MM_HINT_T1);
    if (bpk > 64 * 256) _mm_prefetch(p + 64, _MM_HINT_T1);
}

/* One block of `rows` rows of pairs x, k-major (K2, rows), against one panel w: y = the sums
 * plus the bias, or with `add` y += them. */
static inline __attribute__((always_inline)) void tile(const uint32_t *x, const uint16_t *w,
                                                       const char *pf, int64_t bpk, float *y,
                                                       int64_t ldy, int64_t ncols,
                                                       const float *bias, int64_t K2,
                                                       const int rows, const int add) {
    const __mmask16 k0 = ncols >= 16 ? 0xFFFF : (__mmask16)((1u << ncols) - 1);
    const __mmask16 k1 = ncols >= 32   ? 0xFFFF
                         : ncols <= 16 ? 0
                                       : (__mmask16)((1u << (ncols - 16)) - 1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
    __m512 a0[MR], a1[MR];
#pragma GCC unroll 14
    for (int m = 0; m < rows; m++) { /* y's lines requested for writing, there when K is done */
        a0[m] = b0, a1[m] = b1;
        __builtin_prefetch(y + m * ldy, 1, 3);
        __builtin_prefetch(y + m * ldy + 16, 1, 3);
    }
    for (int64_t k = 0; k < K2; k++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k * NR * 2);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k * NR * 2 + 32);
        if (pf) panel_share(pf, k, bpk);
#pragma GCC unroll 14
        for (int m = 0; m < rows; m++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)x[k * rows + m]);
            a0[m] = _mm512_dpbf16_ps(a0[m], xb, w0);
            a1[m] = _mm512_dpbf16_ps(a1[m], xb, w1);
        }
    }
#pragma GCC unroll 14
    for (int m = 0; m < rows; m++) {
        if (add) { /* y += the linear, one float32 add: the bits of writing it, then adding */
            a0[m] = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, y + m * ldy), a0[m]);
            a1[m] = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, y + m * ldy + 16), a1[m]);
        }
        _mm512_mask_storeu_ps(y + m * ldy, k0, a0[m]);
        _mm512_mask_storeu_ps(y + m * ldy + 16, k1, a1[m]);
    }
}

static void tile_rows(const uint32_t *x, const uint16_t *w, const char *pf, int64_t bpk, float *y,
                      int64_t ldy, int64_t ncols, const float *bias, int64_t K2, int rows,
                      int add) {
    switch (rows + 16 * add) { /* one register-resident specialisation per row count */
#define TILE(n) \
    case n: tile(x, w, pf, bpk, y, ldy, ncols, bias, K2, n, 0); break; \
    case n + 16: tile(x, w, pf, bpk, y, ldy, ncols, bias, K2, n, 1); break;
        TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7)
        TILE(8) TILE(9) TILE(10) TILE(11) TILE(12) TILE(13) TILE(14)
#undef TILE
    }
}

/* One block of `rows` rows of pairs x against a gate panel wg and its up panel wu of a fused
 * gate/up weight, requesting its share of the next two (pfg, pfu; bpk as in tile(): 30 layers'
 * gate/up and down at 200 rows 79.4-84.8 -> 75.6-79.2 ms without and with, Zen 4, 2 threads):
 * y (bfloat16, row stride ldy) = silu(gate) * up, from the same float32 sums
 * and the same product (silu.h) as the linear and then act_norm.c's silu_mul, rounded as the
 * down projection rounds its rows, so the bits match that path's. */
static inline __attribute__((always_inline)) void tile_silu(const uint32_t *x, const uint16_t *wg,
                                                            const uint16_t *wu, const char *pfg,
                                                            const char *pfu, int64_t bpk,
                                                            uint16_t *y, int64_t ldy,
                                                            const float *bg, const float *bu,
                                                            int64_t K2, const int rows) {
    const __m512 g0 = bg ? _mm512_loadu_ps(bg) : _mm512_setzero_ps();
    const __m512 g1 = bg ? _mm512_loadu_ps(bg + 16) : _mm512_setzero_ps();
    const __m512 u0 = bu ? _mm512_loadu_ps(bu) : _mm512_setzero_ps();
    const __m512 u1 = bu ? _mm512_loadu_ps(bu + 16) : _mm512_setzero_ps();
    __m512 a[4 * MR_SILU];
#pragma GCC unroll 7
    for (int m = 0; m < rows; m++) {
        a[4 * m] = g0, a[4 * m + 1] = g1, a[4 * m + 2] = u0, a[4 * m + 3] = u1;
        __builtin_prefetch(y + m * ldy, 1, 3);
    }
    for (int64_t k = 0; k < K2; k++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wg + k * NR * 2);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wg + k * NR * 2 + 32);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wu + k * NR * 2);
        const __m512bh w3 = (__m512bh)_mm512_loadu_si512(wu + k * NR * 2 + 32);
        if (pfg) panel_share(pfg, k, bpk), panel_share(pfu, k, bpk);
#pragma GCC unroll 7
        for (int m = 0; m < rows; m++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)x[k * rows + m]);
            a[4 * m] = _mm512_dpbf16_ps(a[4 * m], xb, w0);
            a[4 * m + 1] = _mm512_dpbf16_ps(a[4 * m + 1], xb, w1);
            a[4 * m + 2] = _mm512_dpbf16_ps(a[4 * m + 2], xb, w2);
            a[4 * m + 3] = _mm512_dpbf16_ps(a[4 * m + 3], xb, w3);
        }
    }
#pragma GCC unroll 7
    for (int m = 0; m < rows; m++) {
        const __m512 lo = silu_mul16(a[4 * m], a[4 * m + 2]);
        const __m512 hi = silu_mul16(a[4 * m + 1], a[4 * m + 3]);
        _mm256_storeu_si256((__m256i *)(y + m * ldy), (__m256i)_mm512_cvtneps_pbh(lo));
        _mm256_storeu_si256((__m256i *)(y + m * ldy + 16), (__m256i)_mm512_cvtneps_pbh(hi));
    }
}

static void tile_silu_rows(const uint32_t *x, const uint16_t *wg, const uint16_t *wu,
                           const char *pfg, const char *pfu, int64_t bpk, uint16_t *y,
                           int64_t ldy, const float *bg, const float *bu, int64_t K2, int rows) {
    switch (rows) { /* one register-resident specialisation per row count */
#define TILE(n) \
    case n: tile_silu(x, wg, wu, pfg, pfu, bpk, y, ldy, bg, bu, K2, n); break;
        TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7)
#undef TILE
    }
}

/* One block of up to 16 rows of float32 x (rows, K), stride ldx, as bfloat16 pairs k-major
 * (K2, rows), the odd tail zero (bfloat16 rows, x_bf16: their words as they are, nothing past
 * K read): 16 pairs of each row converted at a time and transposed in
 * registers, so each k pair's `rows` words are one masked store (the scalar scatter of each
 * word took a quarter of a 1,024-row linear's time on Zen 5). */
static void to_pairs(const void *x, int64_t ldx, int x_bf16, uint32_t *out, int64_t rows,
                     int64_t K, int64_t K2) {
    const __mmask16 live = (__mmask16)((1u << rows) - 1);
    for (int64_t k = 0; k < 2 * K2; k += 32) {
        const int64_t n = K - k;
        const __mmask16 lo = n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
        const __mmask16 hi = n >= 32   ? 0xFFFF
                             : n <= 16 ? 0
                                       : (__mmask16)((1u << (n - 16)) - 1);
        __m512i r[16];
        for (int64_t m = 0; m < 16; m++) {
            if (m >= rows) {
                r[m] = _mm512_setzero_si512();
                continue;
            }
            if (x_bf16) { /* bfloat16 rows: their words are the pairs, nothing past K read */
                const uint16_t *row = (const uint16_t *)x + m * ldx + k;
                r[m] = _mm512_maskz_loadu_epi16(((__mmask32)hi << 16) | lo, row);
                continue;
            }
            const float *row = (const float *)x + m * ldx + k;
            const __m512 a = _mm512_maskz_loadu_ps(lo, row);
            const __m512 b = _mm512_maskz_loadu_ps(hi, row + 16);
            r[m] = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* word j: the pair (k + 2j, k + 2j + 1) */
        }
        transpose16(r);
        const int64_t pairs = K2 - k / 2 < 16 ? K2 - k / 2 : 16;
        for (int64_t j = 0; j < pairs; j++)
            _mm512_mask_storeu_epi32(out + (k / 2 + j) * rows, live, r[j]);
    }
}

/* The rows of block b of M rows split into `blocks` near-equal blocks start at block_start. */
static inline int64_t block_start(int64_t M, int64_t blocks, int64_t b) {
    return b * (M / blocks) + (b < M % blocks ? b : M % blocks);
}

/* Where block b of `blocks` requests its share of the panel after this one (`next`, `panel`
 * values long; none: NULL) as it works on this one, SHARE_BPK bytes (x256) a k pair: tile(). */
static inline const char *next_share(const uint16_t *next, int64_t panel, int64_t b,
                                     int64_t blocks) {
    return next ? (const char *)next + b * panel * 2 / blocks : 0;
}
#define SHARE_BPK(blocks) (NR * 4 * 256 / (blocks))

/* Panel p of W against all `M` rows of pairs x, in blocks of up to MR rows, each requesting
 * its share of panel p + 1 (where there is one) as it goes. */
static void gemm_panel(const uint32_t *x, int64_t K2, const uint16_t *w, const float *bias,
                       float *y, int64_t ldy, int add, int64_t M, int64_t N, int64_t p) {
    const int64_t panels = (N + NR - 1) / NR, blocks = (M + MR - 1) / MR;
    const int64_t panel = K2 * NR * 2; /* bfloat16 values a panel */
    const uint16_t *wp = w + p * panel;
    const uint16_t *next = p + 1 < panels ? wp + panel : 0;
    const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t m0 = block_start(M, blocks, b), rows = block_start(M, blocks, b + 1) - m0;
        tile_rows(x + m0 * K2, wp, next_share(next, panel, b, blocks), SHARE_BPK(blocks),
                  y + m0 * ldy + p * NR, ldy, ncols, bias ? bias + p * NR : 0, K2, (int)rows,
                  add);
    }
}

/* gemm_panel for a fused gate/up weight (N columns: gate, then up; N/2 a multiple of NR): gate
 * panel p with up panel p + N/2/NR, silu(gate) * up into y (M x N/2, bfloat16). */
static void gemm_panel_silu(const uint32_t *x, int64_t K2, const uint16_t *w, const float *bias,
                            uint16_t *y, int64_t ldy, int64_t M, int64_t N, int64_t p) {
    const int64_t n = N / 2, panels = n / NR, blocks = (M + MR_SILU - 1) / MR_SILU;
    const int64_t panel = K2 * NR * 2;
    const uint16_t *wg = w + p * panel, *wu = w + (p + panels) * panel;
    const int more = p + 1 < panels;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t m0 = block_start(M, blocks, b), rows = block_start(M, blocks, b + 1) - m0;
        tile_silu_rows(x + m0 * K2, wg, wu, next_share(more ? wg + panel : 0, panel, b, blocks),
                       next_share(more ? wu + panel : 0, panel, b, blocks), SHARE_BPK(blocks),
                       y + m0 * ldy + p * NR, ldy, bias ? bias + p * NR : 0,
                       bias ? bias + n + p * NR : 0, K2, (int)rows);
    }
}

struct gemm_args { /* one call of gemm_bf16, as its slices see it */
    const void *x;
    int64_t ldx, xw, K, K2, N, ldy;
    int x_bf16, mode;
    const uint16_t *w;
    const float *bias;
    void *y;
};

/* Block b of the slice of `rows` rows at m0, split into `blocks` near-equal blocks, as pairs
 * k-major (K2, its rows) at its rows' place in `pairs`, as gemm_panel reads them. */
static void slice_pairs(const struct gemm_args *a, uint32_t *pairs, int64_t m0, int64_t rows,
                        int64_t blocks, int64_t b) {
    const int64_t r0 = block_start(rows, blocks, b), r1 = block_start(rows, blocks, b + 1);
    to_pairs((const char *)a->x + (m0 + r0) * a->ldx * a->xw, a->ldx, a->x_bf16,
             pairs + r0 * a->K2, r1 - r0, a->K, a->K2);
}

/* The panels a call runs (gate/up pairs of them in SILU) and the most rows of its blocks. */
static inline int64_t panels_of(const struct gemm_args *a) {
    return a->mode == SILU ? a->N / 2 / NR : (a->N + NR - 1) / NR;
}
static inline int64_t block_rows(const struct gemm_args *a) {
    return a->mode == SILU ? MR_SILU : MR;
}

/* Panel p (a gate/up pair of them in SILU) against the slice of `rows` rows at m0. */
static void slice_panel(const struct gemm_args *a, const uint32_t *pairs, int64_t m0,
                        int64_t rows, int64_t p) {
    if (a->mode == SILU)
        gemm_panel_silu(pairs, a->K2, a->w, a->bias, (uint16_t *)a->y + m0 * a->ldy, a->ldy, rows,
                        a->N, p);
    else
        gemm_panel(pairs, a->K2, a->w, a->bias, (float *)a->y + m0 * a->ldy, a->ldy,
                   a->mode == ADD, rows, a->N, p);
}

/* The rows shared among the threads in whole blocks (row_chunks.h: each thread its own share,
 * a slice at a time, then what another has not started): each thread rounds its slices to
 * pairs and runs every panel over them, the pairs staying in its own L2 (when the threads share
 * each slice's panels, each reads the pairs the other made, from the other core). Zen 4, 2
 * threads, SmolLM2's four linears of a layer at 4,096 rows, alternating in one process: 86.6%
 * of peak (median) with the panels shared, 91.0% split by rows; 30 distinct layers: 83.9 ->
 * 88.8%; at 256 rows 74.4 -> 84.4%. */
static void gemm_row_split(const struct gemm_args *a, uint32_t *pairs, int64_t mc, int64_t M,
                           int threads) {
    const int64_t panels = panels_of(a), mr = block_rows(a), units = (M + mr - 1) / mr;
    const int64_t most = mc / mr > 1 ? mc / mr : 1, least = (CHUNK_LEAST_ROWS + mr - 1) / mr;
    Share shares[threads];
    share_units(shares, units, threads);
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; t++) {
        uint32_t *own = pairs + t * mc * a->K2;
        int64_t u0, n;
        while ((n = claim_units(shares, threads, t, most, least, most, &u0)) > 0) {
            const int64_t m0 = u0 * mr, end = (u0 + n) * mr < M ? (u0 + n) * mr : M;
            const int64_t rows = end - m0, blocks = (rows + mr - 1) / mr;
            for (int64_t b = 0; b < blocks; b++) slice_pairs(a, own, m0, rows, blocks, b);
            for (int64_t p = 0; p < panels; p++) slice_panel(a, own, m0, rows, p);
        }
    }
}

/* Each slice's blocks rounded to pairs by all threads, then its panels shared out among them,
 * each thread its own share a panel at a time, then half of another's rest (row_chunks.h): for
 * few rows, where W's bytes outweigh the rows' and each thread reads only its panels. */
static void gemm_panel_split(const struct gemm_args *a, uint32_t *pairs, int64_t mc, int64_t M,
                             int threads) {
    const int64_t panels = panels_of(a), mr = block_rows(a);
    Share shares[threads];
#pragma omp parallel num_threads(threads)
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t rows = M - m0 < mc ? M - m0 : mc, blocks = (rows + mr - 1) / mr;
#pragma omp single nowait /* set before any claim: the pairs' loop ends in a barrier */
        share_units(shares, panels, threads);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) slice_pairs(a, pairs, m0, rows, blocks, b);
#pragma omp for schedule(static, 1) /* its barrier: the pairs and shares are done with */
        for (int t = 0; t < threads; t++) {
            int64_t p0, n;
            while ((n = claim_units(shares, threads, t, 1, 1, panels, &p0)) > 0)
                for (int64_t p = p0; p < p0 + n; p++) slice_panel(a, pairs, m0, rows, p);
        }
    }
}

/* A slice of rows at a time whose pairs (MC_BYTES, at least 8 row blocks) stay in L2 while
 * every panel passes over them; each slice streams all of W again, so slices as large as L2
 * allows (Zen 4, 1 MB L2, 2 threads, SmolLM2's linears at 4,096 rows: 128 KB slices 70-71% of
 * peak, 512 KB 80-81%; equal at 64-1,024 rows). Steps of small_gemm_split_rows() rows a
 * thread or more give each thread a share of the rows, in its own slices (gemm_row_split);
 * fewer share each slice's panels (gemm_panel_split); either way a thread done with its share
 * takes from another's (row_chunks.h). The threads' split changes no bit: each row's sums run
 * over k in order whichever thread makes them. x: float32 rows, or bfloat16 (x_bf16); y:
 * float32 (M x N, row stride ldy) written (STORE) or added to (ADD), or bfloat16 silu(gate) *
 * up (SILU; M x N/2). Returns nonzero when the scratch cannot be allocated. */
#define MC_BYTES (512 * 1024)
static int gemm_bf16(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                     const float *bias, void *y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                     int threads, int mode) {
    const struct gemm_args a = {x, ldx, x_bf16 ? 2 : 4, K, (K + 1) / 2, N, ldy, x_bf16, mode,
                                w, bias, y};
    const int64_t K2 = a.K2 > 0 ? a.K2 : 1;
    if (threads < 1) threads = 1;
    const int split = threads > 1 && M >= small_gemm_split_rows(-1) * threads;
    int64_t mc = MC_BYTES / 4 / K2;
    mc = mc < 8 * MR ? 8 * MR : mc - mc % MR;
    if (mc > M) mc = M > 0 ? M : 1;
    uint32_t *pairs = malloc((size_t)mc * (size_t)K2 * 4 * (size_t)(split ? threads : 1));
    if (!pairs) return 1;
    if (split)
        gemm_row_split(&a, pairs, mc, M, threads);
    else
        gemm_panel_split(&a, pairs, mc, M, threads);
    free(pairs);
    return 0;
}

int small_gemm_bf16(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y,
                    int64_t M, int64_t N, int64_t K, int threads) {
    if (takes_amx(M, K)) return small_gemm_amx(x, ldx, 0, w, bias, y, N, 0, M, N, K, threads);
    return gemm_bf16(x, ldx, 0, w, bias, y, N, M, N, K, threads, STORE);
}

#else

int small_gemm_bf16_fast(void) { return 0; }

static int gemm_bf16(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                     const float *bias, void *y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                     int threads, int mode) {
    (void)x, (void)ldx, (void)x_bf16, (void)w, (void)bias, (void)y, (void)ldy, (void)M, (void)N;
    (void)K, (void)threads, (void)mode;
    return 3; /* not built: the entry points decline */
}

int small_gemm_bf16(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y,
                    int64_t M, int64_t N, int64_t K, int threads) {
    (void)x, (void)ldx, (void)w, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)threads;
    return 2; /* not built: callers check small_gemm_bf16_fast() first */
}

#endif
