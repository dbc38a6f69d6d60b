/* y = x W^T + b for steps of few rows (decode, short prefill chunks), float32, on CPUs.
 *
 * W (N, K) is packed once into panels of 32 output columns, (ceil(N/32), K, 32), zero-padded:
 * one k step of a panel is two 64-byte vectors. A panel is read from memory once a call and
 * then from L2 for every block of up to 14 rows of x, each block's 28 accumulators staying in
 * registers for the whole of K (one FMA chain per output, k in order). While the row blocks
 * work on a panel, the next panel is prefetched into L2, each block fetching its share of it
 * (1/blocks), so weights stream from memory behind all of the arithmetic. When only the first
 * block prefetched, memory sat idle while the others ran: a SmolLM2 step of 52 rows (30
 * distinct layers and the lm_head, 2 cores) took 59 ms against 48.5 now, 16 rows 31 against 28.
 * Threads split the panels, or a step's rows where it has split_rows rows a thread or more.
 * Many rows (a prefill step) run in slices of rows that stay in L2.
 *
 * Against oneDNN's prepacked linear (SmolLM2 layer shapes, 30 distinct layers, 2 cores), before
 * the shared prefetch: 52 rows 62 -> 46 ms a step, 16 rows 33 -> 24 ms, 256 rows about even.
 *
 * With AVX2 (16 vector registers of 8 floats) the same scheme runs on panels of 16 columns and
 * blocks of up to 6 rows: 12 accumulators, 2 weight vectors and a broadcast. NEON (aarch64: 32
 * registers of 4 floats) takes the same panels and blocks of up to 5 rows: 20 accumulators, 4
 * weight vectors and the 5 rows' values of one k, which gcc loads together (at 6 rows it spilled
 * two accumulators, a store-to-load chain every k). Without any of them small_gemm_fast()
 * returns 0 and callers keep their library path. small_gemm_panel() gives the panel width the
 * packing must use (cpu_kernels.pack_gemm_weight).
 */
#include <stdint.h>
#include <string.h>

#include "isa.h"
#include "layer_kernels.h"
#include "row_chunks.h"

#if defined(JR_AVX2)
#define NR 16 /* output columns per panel */
#define MR 6  /* most rows per block: 12 accumulators + 2 weight vectors + 1 broadcast */
#elif defined(JR_NEON)
#define NR 16 /* output columns per panel */
#define MR 5  /* most rows per block: 20 accumulators + 4 weight vectors + 5 row values */
#else
#define NR 32 /* output columns per panel */
#define MR 14 /* most rows per block: 28 accumulators + 2 weight vectors + 1 broadcast */
#endif

int small_gemm_panel(void) { return NR; }

#if defined(JR_AVX512)

int small_gemm_fast(void) { return 1; }

static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, int64_t K,
                                                       const float *w, const char *pf,
                                                       int64_t bpk, float *y, int64_t ldy,
                                                       int64_t ncols, const float *bias,
                                                       const int rows) {
    __m512 a0[MR], a1[MR];
#pragma GCC unroll 14
    for (int m = 0; m < rows; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 w0 = _mm512_loadu_ps(w + k * NR), w1 = _mm512_loadu_ps(w + k * NR + 16);
        if (pf) { /* this block's share of the next panel: bpk/256 bytes per k */
            const char *p = pf + ((k * bpk) >> 8);
            _mm_prefetch(p, _MM_HINT_T1);
            if (bpk > 64 * 256) _mm_prefetch(p + 64, _MM_HINT_T1);
        }
#pragma GCC unroll 14
        for (int m = 0; m < rows; m++) {
            const __m512 xb = _mm512_set1_ps(x[m * ldx + k]);
            a0[m] = _mm512_fmadd_ps(xb, w0, a0[m]);
            a1[m] = _mm512_fmadd_ps(xb, w1, a1[m]);
        }
    }
    const __mmask16 k0 = ncols >= 16 ? 0xFFFF : (__mmask16)((1u << ncols) - 1);
    const __mmask16 k1 = ncols >= 32   ? 0xFFFF
                         : ncols <= 16 ? 0
                                       : (__mmask16)((1u << (ncols - 16)) - 1);
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        b0 = _mm512_maskz_loadu_ps(k0, bias);
        b1 = _mm512_maskz_loadu_ps(k1, bias + 16);
    }
#pragma GCC unroll 14
    for (int m = 0; m < rows; m++) {
        _mm512_mask_storeu_ps(y + m * ldy, k0, _mm512_add_ps(a0[m], b0));
        _mm512_mask_storeu_ps(y + m * ldy + 16, k1, _mm512_add_ps(a1[m], b1));
    }
}

static void tile_rows(const float *x, int64_t ldx, int64_t K, const float *w, const char *pf,
                      int64_t bpk, float *y, int64_t ldy, int64_t ncols, const float *bias,
                      int rows) {
    switch (rows) { /* one register-resident specialisation per row count */
#define TILE(n) \
    case n: tile(x, ldx, K, w, pf, bpk, y, ldy, ncols, bias, n); break;
        TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7)
        TILE(8) TILE(9) TILE(10) TILE(11) TILE(12) TILE(13) TILE(14)
#undef TILE
    }
}

#elif defined(JR_AVX2)

int small_gemm_fast(void) { return 1; }

/* tile() of the AVX-512 path with 8-float vectors: a panel of 16 columns is one 64-byte line
 * per k, so a block prefetching its share of the next panel takes at most one line per k. */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, int64_t K,
                                                       const float *w, const char *pf,
                                                       int64_t bpk, float *y, int64_t ldy,
                                                       int64_t ncols, const float *bias,
                                                       const int rows) {
    __m256 a0[MR], a1[MR];
#pragma GCC unroll 6
    for (int m = 0; m < rows; m++) a0[m] = a1[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 w0 = _mm256_loadu_ps(w + k * NR), w1 = _mm256_loadu_ps(w + k * NR + 8);
        if (pf) _mm_prefetch(pf + ((k * bpk) >> 8), _MM_HINT_T1); /* bpk/256 bytes per k */
#pragma GCC unroll 6
        for (int m = 0; m < rows; m++) {
            const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
            a0[m] = _mm256_fmadd_ps(xb, w0, a0[m]);
            a1[m] = _mm256_fmadd_ps(xb, w1, a1[m]);
        }
    }
    const __m256i k0 = tail_mask8(ncols >= 8 ? 8 : ncols);
    const __m256i k1 = tail_mask8(ncols >= 16 ? 8 : ncols <= 8 ? 0 : ncols - 8);
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    if (bias) {
        b0 = _mm256_maskload_ps(bias, k0);
        b1 = _mm256_maskload_ps(bias + 8, k1);
    }
    if (ncols == NR) {
#pragma GCC unroll 6
        for (int m = 0; m < rows; m++) {
            _mm256_storeu_ps(y + m * ldy, _mm256_add_ps(a0[m], b0));
            _mm256_storeu_ps(y + m * ldy + 8, _mm256_add_ps(a1[m], b1));
        }
        return;
    }
#pragma GCC unroll 6
    for (int m = 0; m < rows; m++) {
        _mm256_maskstore_ps(y + m * ldy, k0, _mm256_add_ps(a0[m], b0));
        _mm256_maskstore_ps(y + m * ldy + 8, k1, _mm256_add_ps(a1[m], b1));
    }
}

#elif defined(JR_NEON)

int small_gemm_fast(void) { return 1; }

/* tile() with 4-float vectors: a k step of a 16-column panel is four vectors, one 64-byte line,
 * so a block prefetching its share of the next panel takes at most one line per k (prfm into
 * L2). A panel narrower than 16 columns is written through a row buffer (NEON has no masked
 * store), its bias read from a zero-padded copy. */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, int64_t K,
                                                       const float *w, const char *pf,
                                                       int64_t bpk, float *y, int64_t ldy,
                                                       int64_t ncols, const float *bias,
                                                       const int rows) {
    float32x4_t a[MR][4];
#pragma GCC unroll 5
    for (int m = 0; m < rows; m++) a[m][0] = a[m][1] = a[m][2] = a[m][3] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < K; k++) {
        const float *wk = w + k * NR;
        const float32x4_t w0 = vld1q_f32(wk), w1 = vld1q_f32(wk + 4);
        const float32x4_t w2 = vld1q_f32(wk + 8), w3 = vld1q_f32(wk + 12);
        if (pf) __builtin_prefetch(pf + ((k * bpk) >> 8), 0, 2); /* bpk/256 bytes per k */
#pragma GCC unroll 5
        for (int m = 0; m < rows; m++) {
            const float32x4_t xb = vld1q_dup_f32(x + m * ldx + k);
            a[m][0] = vfmaq_f32(a[m][0], xb, w0);
            a[m][1] = vfmaq_f32(a[m][1], xb, w1);
            a[m][2] = vfmaq_f32(a[m][2], xb, w2);
            a[m][3] = vfmaq_f32(a[m][3], xb, w3);
        }
    }
    float bpad[NR] = {0}, row[NR];
    const float *b = bias;
    if (bias && ncols < NR) {
        for (int64_t n = 0; n < ncols; n++) bpad[n] = bias[n];
        b = bpad;
    }
    float32x4_t bv[4];
    for (int c = 0; c < 4; c++) bv[c] = b ? vld1q_f32(b + 4 * c) : vdupq_n_f32(0.0f);
#pragma GCC unroll 5
    for (int m = 0; m < rows; m++) {
        float *dst = ncols == NR ? y + m * ldy : row;
        for (int c = 0; c < 4; c++) vst1q_f32(dst + 4 * c, vaddq_f32(a[m][c], bv[c]));
        if (ncols < NR) memcpy(y + m * ldy, row, sizeof(float) * (size_t)ncols);
    }
}

#endif

#if defined(JR_AVX2) || defined(JR_NEON)

static void tile_rows(const float *x, int64_t ldx, int64_t K, const float *w, const char *pf,
                      int64_t bpk, float *y, int64_t ldy, int64_t ncols, const float *bias,
                      int rows) {
    switch (rows) { /* one register-resident specialisation per row count */
#define TILE(n) \
    case n: tile(x, ldx, K, w, pf, bpk, y, ldy, ncols, bias, n); break;
        TILE(1) TILE(2) TILE(3) TILE(4) TILE(5)
#if MR >= 6
        TILE(6)
#endif
#undef TILE
    }
}
#endif

#if defined(JR_AVX512) || defined(JR_AVX2) || defined(JR_NEON)

/* Panel p of W against all M rows of x, in near-equal blocks of up to MR rows, each fetching
 * its share of panel p + 1 (where there is one) into L2. x: (M, K) with row stride ldx; w:
 * packed (ceil(N/NR), K, NR); bias: (N) or NULL; y: (M, N) contiguous. */
static void gemm_panel(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                       int64_t M, int64_t N, int64_t K, int64_t p) {
    const int64_t panels = (N + NR - 1) / NR, blocks = (M + MR - 1) / MR;
    const float *wp = w + p * K * NR;
    const float *next = p + 1 < panels ? wp + K * NR : 0;
    const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
    for (int64_t b = 0, m0 = 0; b < blocks; b++) {
        const int64_t rows = (M - m0) / (blocks - b);
        const char *pf = next ? (const char *)next + b * K * NR * 4 / blocks : 0;
        tile_rows(x + m0 * ldx, ldx, K, wp, pf, NR * 4 * 256 / blocks, y + m0 * N + p * NR, N,
                  ncols, bias ? bias + p * NR : 0, (int)rows);
        m0 += rows;
    }
}

/* Steps of many rows (prefill) run a slice of rows at a time, MC_BYTES of x (at least 8 row
 * blocks) staying in L2 while every panel passes over it; one pass over all M rows read x from
 * L3 once a panel: 4,096 rows of SmolLM2's layers, 1 thread, 69 GFLOP/s against 95 in slices
 * (on a loaded machine, whose other processes share L3). */
#define MC_BYTES (128 * 1024)

static int64_t slice_rows(int64_t K) {
    const int64_t mc = MC_BYTES / 4 / (K > 0 ? K : 1);
    return mc < 8 * MR ? 8 * MR : mc - mc % MR;
}

/* Rows `lo` .. `hi` of x, a slice at a time, every panel over each: one chunk of a thread. */
static void gemm_slices(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                        int64_t lo, int64_t hi, int64_t N, int64_t K) {
    const int64_t mc = slice_rows(K), panels = (N + NR - 1) / NR;
    for (int64_t m0 = lo; m0 < hi; m0 += mc)
        for (int64_t p = 0; p < panels; p++)
            gemm_panel(x + m0 * ldx, ldx, w, bias, y + m0 * N, hi - m0 < mc ? hi - m0 : mc, N, K,
                       p);
}

#endif

/* Rows a thread from which a step splits its rows among the threads (each its own slices, no
 * thread waiting on another between them) rather than each slice's panels; this kernel and
 * small_gemm_bf16.c's take it. At fewer rows W's bytes outweigh the rows' and each thread
 * reading all of W costs more than sharing the panels. Zen 4, 2 threads, alternating in one
 * process, medians, SmolLM2's four layer linears, panels shared against rows split: float32 at
 * 4,096 rows 178.9 -> 189.0 GFLOP/s on AVX-512, 170.3 -> 179.3 on the AVX2 build, even at 256
 * and 1,024; bfloat16 (vdpbf16ps) at 4,096 rows 86.6 -> 91.0% of peak, 256 rows of 30 layers'
 * weights 74.4 -> 84.4%, 128 rows of one layer's 85.8 against 79.9, of 30 layers' 83.8
 * against 83.0, 64 rows 76.5 against 64.0. cpu_kernels.gemm_split_rows() may set it. */
static int64_t split_rows = 128;

/* The rows a thread from which a step splits rows, after setting it to `rows` when rows >= 0. */
int64_t small_gemm_split_rows(int64_t rows) {
    if (rows >= 0) split_rows = rows;
    return split_rows;
}

#if defined(JR_AVX512) || defined(JR_AVX2) || defined(JR_NEON)

void small_gemm(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads) {
    if (threads < 1) threads = 1;
    if (threads > 1 && M >= split_rows * threads) { /* shares of row blocks: row_chunks.h */
        const int64_t units = (M + MR - 1) / MR, most = slice_rows(K) / MR;
        const int64_t least = (CHUNK_LEAST_ROWS + MR - 1) / MR;
        Share shares[threads];
        share_units(shares, units, threads);
#pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (int t = 0; t < threads; t++) {
            int64_t u0, n;
            while ((n = claim_units(shares, threads, t, most, least, most, &u0)) > 0)
                gemm_slices(x, ldx, w, bias, y, u0 * MR, (u0 + n) * MR < M ? (u0 + n) * MR : M,
                            N, K);
        }
        return;
    }
    /* fewer rows: each slice's panels shared out, a panel at a time (row_chunks.h) */
    const int64_t mc = slice_rows(K), panels = (N + NR - 1) / NR;
    Share shares[threads];
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        const int64_t rows = M - m0 < mc ? M - m0 : mc;
        share_units(shares, panels, threads);
#pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (int t = 0; t < threads; t++) {
            int64_t p0, n;
            while ((n = claim_units(shares, threads, t, 1, 1, panels, &p0)) > 0)
                for (int64_t p = p0; p < p0 + n; p++)
                    gemm_panel(x + m0 * ldx, ldx, w, bias, y + m0 * N, rows, N, K, p);
        }
    }
}

#else

int small_gemm_fast(void) { return 0; }

void small_gemm(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads) {
    (void)threads;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float *wp = w + (n / NR) * K * NR + n % NR;
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += x[m * ldx + k] * wp[k * NR];
            y[m * N + n] = acc + (bias ? bias[n] : 0.0f);
        }
}

#endif
