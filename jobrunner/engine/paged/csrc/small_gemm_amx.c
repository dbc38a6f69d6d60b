/* y = x W^T + b with bfloat16 weights on AMX tiles (Sapphire Rapids, Emerald and Granite
 * Rapids): float32 x and y, float32 accumulation; small_gemm_bf16() hands it steps of
 * amx_rows rows or more whose K is a multiple of 32.
 *
 * The weights are small_gemm_bf16.c's panels unchanged: (ceil(N/32), K/2, 32, 2) bfloat16, so
 * one k pair of a panel is 128 bytes and 16 k pairs of 16 of its columns are one B tile (16
 * rows of 64 bytes, stride 128). Both threads first round x to bfloat16 (to nearest even, as
 * the vdpbf16ps path) into A tiles laid end to end: 16 rows x 32 k, 1 KB each, rows past M
 * zero. Then the columns go out in blocks of panels shared among the threads (a block's
 * weights stay in L2 while every row passes over them), and each 32 rows x one panel holds
 * 2 x 2 float32 C tiles (16 x 16) over the whole of K, each A and B tile feeding two
 * tdpbf16ps (16 x 16 x 32 multiply-adds each); C starts from the bias. A short last panel
 * or row block goes through a scratch tile.
 *
 * Rows whose tiles fit L2 (1 MB) stay there while each panel passes once; more rows pass over
 * blocks of panels instead: 2 cores of an AMX Xeon, SmolLM2's 120 linears, 4,096 rows, every
 * panel past 900-row slices held in L2 (the earlier kernel) ran 1.2 TFLOP/s, as W streaming
 * through L2 evicted the rows; blocks of 8 panels held in L2, 1.55. With the rounding shared
 * by both threads: 64 rows 17.1 -> 13.7 ms, 1,024 rows 165 -> 115 (docs/performance.md).
 * Where Linux does not grant the tiles (amx.c), or the build lacks AMX, the vdpbf16ps path runs.
 *
 * x may instead come as bfloat16 rows, already rounded where they were computed (a norm
 * writing them, act_norm.c's rms_norm_bf16; the fused gate/up product below): the tiles are
 * then loaded from the rows in place, at their own stride, with no rounding pass, and the
 * result is the same bits as for the float32 rows they were rounded from (2 cores of an AMX
 * Xeon: SmolLM2's qkv at 8,192 rows 5.44 -> 4.11 ms, its down at 1,024 1.18 -> 0.89).
 *
 * A linear followed by a residual add (o_proj, down) can add into the stream instead (ADD):
 * each block's outputs go to an L1 block and from there are added into y's rows, the same bits
 * as the linear and then `y += it`, neither written out nor read back (8,192 rows of o_proj:
 * 4.56 -> 3.60 ms against the linear and torch's add).
 *
 * A SiLU-gated MLP's fused gate/up weight can instead store silu(gate) * up (small_gemm_amx_silu):
 * per row block, a gate panel and its up panel into two 32 x 32 blocks that stay in L1, then
 * the product (silu.h, as act_norm.c's silu_mul computes it) to y. The float32 outputs are
 * what this kernel pays most for beyond its tile products (one core, SmolLM2's linears at 512
 * to 4,096 rows: 0.8-1.0 TFLOP/s with them stored, 1.1-1.4 without; the microkernel alone on
 * operands in L1 and L2, 1.7-2.45), and this never writes the projection, twice y's size: (b)'s
 * prefill 15.5 -> 14.6 s of CPU (docs/performance.md). It stores the product as bfloat16, the
 * rows the down projection takes in place.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "silu.h"

#ifdef JR_AMX

#define NR 32 /* output columns per panel, as small_gemm_bf16.c */
#define NB 8 /* panels a column block: 8 x K x 64 bytes of weights in L2 */
#define L2_ROWS_BYTES (1 << 20) /* rows' tiles up to this size are left in L2 */

/* Tiles 0-3: C (16 rows of 16 float32), 4-5: A (16 rows of 32 bfloat16), 6-7: B (16 k pairs
 * of 16 columns). */

/* The A operand: x rounded into tiles (to_tiles: 1 KB tiles end to end, 16 rows of 64 bytes,
 * rows past M zero), or bfloat16 rows read in place at their own stride, the last 32-row block
 * from a zero-padded copy (tail) so no tile reads past x. */
typedef struct {
    const uint16_t *a;
    int64_t k;      /* elements from one k pair to the next within a tile row */
    int64_t stride; /* bytes from one tile row to the next */
    int64_t row;    /* elements from one row to the next (a row block: 16 of them) */
    const uint16_t *tail; /* rows tail_m0.. padded to 32, stride `row`; NULL: none */
    int64_t tail_m0;
} AOperand;

/* Row m0 of A. */
static inline const uint16_t *rows_at(const AOperand *A, int64_t m0) {
    return A->tail && m0 >= A->tail_m0 ? A->tail + (m0 - A->tail_m0) * A->row : A->a + m0 * A->row;
}

/* One block of 32 rows (`two`, else 16) of A from row a on (laid out as A says) against panel
 * w over K2 pairs, C from the 32 biases, stored to y (stride ldy bytes); at each k step of a
 * 32-row block, pf_k lines of the next row block from pf on are requested (next_rows).
 * The B tiles are loaded with the streaming hint (tileloaddt1): a panel is read once a block,
 * and without the hint its 36 KB (K = 576) pushed the block's A rows, reused by every panel of
 * the column block, out of the 48 KB L1. 2 cores of an AMX Xeon, bfloat16 rows, 8,192 of
 * them: qkv 4.2 -> 3.4 ms, o_proj added in 3.1 -> 2.7, gate/up with SiLU 13.7 -> 12.1; down (K =
 * 1,536: its A rows do not fit L1 either way) unchanged. The hint on the A tiles instead, or
 * on both, was slower; so was prefetching the next B tiles by hand (into L1: slower; NTA:
 * 2.5x slower). */
static void block(const uint16_t *a, const AOperand *A, const uint16_t *w, int64_t K2,
                  const float *bias, float *y, int64_t ldy, int two, const char *pf, int pf_k) {
    const int64_t ak = A->k, as = A->stride;
    _tile_loadd(0, bias, 0);
    _tile_loadd(1, bias + 16, 0);
    if (two) {
        const uint16_t *a1 = a + 16 * A->row; /* the second row block's tiles */
        _tile_loadd(2, bias, 0);
        _tile_loadd(3, bias + 16, 0);
        for (int64_t k = 0; k < K2; k += 16) {
            for (int l = 0; l < pf_k; l++)
                _mm_prefetch(pf + (k / 16 * pf_k + l) * 64, _MM_HINT_T1);
            _tile_loadd(4, a + ak * k, as);
            _tile_stream_loadd(6, w + k * NR * 2, NR * 4);
            _tile_stream_loadd(7, w + k * NR * 2 + NR, NR * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + ak * k, as);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(2, (char *)y + 16 * ldy, ldy);
        _tile_stored(3, (char *)y + 16 * ldy + 64, ldy);
    } else {
        for (int64_t k = 0; k < K2; k += 16) {
            _tile_loadd(4, a + ak * k, as);
            _tile_stream_loadd(6, w + k * NR * 2, NR * 4);
            _tile_stream_loadd(7, w + k * NR * 2 + NR, NR * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, y, ldy);
    _tile_stored(1, (char *)y + 64, ldy);
}

/* 16 rows of x (`rows` of them real) rounded to bfloat16 A tiles end to end: tile c holds k
 * 32c..32c+31 of the 16 rows, 64 bytes a row; the rows past `rows` are zero. */
static void to_tiles(const float *x, int64_t ldx, uint16_t *a, int64_t rows, int64_t K) {
    for (int64_t r = 0; r < 16; r++)
        for (int64_t k = 0; k < K; k += 32) {
            __m512i v = _mm512_setzero_si512();
            if (r < rows) {
                const float *row = x + r * ldx + k;
                v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 16), _mm512_loadu_ps(row));
            }
            _mm512_store_si512(a + k * 16 + r * 32, v);
        }
}

/* The biases of panels p0..p1-1 (zero past N, or without a bias), NR to a panel. */
static void panel_bias(const float *bias, int64_t N, int64_t p0, int64_t p1, float b[][NR]) {
    for (int64_t p = p0; p < p1; p++)
        for (int64_t j = 0; j < NR; j++)
            b[p - p0][j] = bias && p * NR + j < N ? bias[p * NR + j] : 0.0f;
}

/* y (r rows, stride ldy, ncols columns) += a block's outputs (r x NR in L1), as torch adds two
 * float32 tensors: a residual updated in place, bit for bit `y += linear`. */
static void add_rows(const float *s, float *y, int64_t ldy, int64_t r, int64_t ncols) {
    const __mmask16 k0 = ncols >= 16 ? 0xFFFF : (__mmask16)((1u << ncols) - 1);
    const __mmask16 k1 = ncols >= 32   ? 0xFFFF
                         : ncols <= 16 ? 0
                                       : (__mmask16)((1u << (ncols - 16)) - 1);
    for (int64_t i = 0; i < r; i++) {
        float *yi = y + i * ldy;
        const __m512 a = _mm512_maskz_loadu_ps(k0, yi), b = _mm512_maskz_loadu_ps(k1, yi + 16);
        _mm512_mask_storeu_ps(yi, k0, _mm512_add_ps(a, _mm512_load_ps(s + i * NR)));
        _mm512_mask_storeu_ps(yi + 16, k1, _mm512_add_ps(b, _mm512_load_ps(s + i * NR + 16)));
    }
}

/* The next 32-row block's A rows, requested into L2 a few lines at each k step of this block's
 * `calls` block() calls on each of its `panels` panels (`lines_a_step` each, `lines_a_call`
 * lines apart), so that its first panel does not
 * wait on L3 for them: 2 cores of an AMX Xeon, SmolLM2's linears at 4,096 rows, 30 layers, 607
 * -> 589 to 685 -> 606 ms; (b)'s prefill linears 8.3 and 8.8 -> 7.8 and 7.9 s of CPU. All 72
 * lines a panel at its start instead, in a burst, was slower (qkv 4.2 -> 5.3 ms on one core).
 * Nothing when this is the last block or a column block has one panel (the rows then fit L2). */
typedef struct {
    const char *at;
    int64_t lines_a_call;
    int lines_a_step;
} NextRows;

static NextRows next_rows(const AOperand *A, int64_t m0, int64_t M, int64_t K, int64_t panels,
                          int64_t calls) {
    if (m0 + 32 >= M || panels < 2) return (NextRows){(const char *)A->a, 0, 0};
    const int64_t rows = M - m0 - 32 < 32 ? M - m0 - 32 : 32, n = panels * calls;
    const int64_t lines = (rows * A->row * 2 + 63) / 64, per_call = (lines + n - 1) / n;
    const int64_t steps = K / 32; /* k steps a call */
    return (NextRows){(const char *)rows_at(A, m0 + 32), per_call,
                      (int)((per_call + steps - 1) / steps)};
}

/* Panels p0..p1-1 against every row: the block's weights stay in L2 as the rows pass. The
 * hardware's prefetcher follows the panels (contiguous): requesting the next block into L2 by
 * hand made every step slower (16 rows, weights from memory, 2 threads: 18.7 -> 22.0 GB/s of
 * weights without it). */
static void column_block(const AOperand *A, const uint16_t *w, const float *bias, float *y,
                         int64_t ldy, int add, int64_t M, int64_t N, int64_t K, int64_t p0,
                         int64_t p1) {
    const int64_t K2 = K / 2, panel = K2 * NR * 2; /* bfloat16 values a panel */
    float scratch[32 * NR] __attribute__((aligned(64)));
    float b[NB][NR] __attribute__((aligned(64)));
    panel_bias(bias, N, p0, p1, b);
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
        const int64_t r = M - m0 < 32 ? M - m0 : 32;
        const int two = r > 16;
        const uint16_t *a = rows_at(A, m0);
        const NextRows next = next_rows(A, m0, M, K, p1 - p0, 1);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
            const int direct = !add && ncols == NR && r == (two ? 32 : 16);
            float *out = direct ? y + m0 * ldy + p * NR : scratch;
            block(a, A, w + p * panel, K2, b[p - p0], out, direct ? ldy * 4 : NR * 4, two,
                  next.at + (p - p0) * next.lines_a_call * 64, next.lines_a_step);
            if (add)
                add_rows(scratch, y + m0 * ldy + p * NR, ldy, r, ncols);
            else if (!direct)
                for (int64_t i = 0; i < r; i++)
                    memcpy(y + (m0 + i) * ldy + p * NR, scratch + i * NR, (size_t)ncols * 4);
        }
    }
}

/* The same for a fused gate/up weight (N = 2n columns, gate then up, n a multiple of NR):
 * gate panels p0..p1-1 and their up panels (n / NR further) into two scratch blocks that stay
 * in L1, and silu(gate) * up stored to y (M x n) rounded to bfloat16, the down projection's
 * rows as it would round them; silu_mul (act_norm.c) computes the same product from the
 * stored linear. The gate/up outputs, twice the size of y, are never written out. */
static void column_block_silu(const AOperand *A, const uint16_t *w, const float *bias,
                              uint16_t *y, int64_t M, int64_t n, int64_t K, int64_t p0,
                              int64_t p1) {
    const int64_t K2 = K / 2, panel = K2 * NR * 2, up = n / NR;
    float g[32 * NR] __attribute__((aligned(64))), u[32 * NR] __attribute__((aligned(64)));
    float bg[NB][NR] __attribute__((aligned(64))), bu[NB][NR] __attribute__((aligned(64)));
    panel_bias(bias, 2 * n, p0, p1, bg);
    panel_bias(bias, 2 * n, p0 + up, p1 + up, bu);
    for (int64_t m0 = 0; m0 < M; m0 += 32) {
        const int64_t r = M - m0 < 32 ? M - m0 : 32;
        const int two = r > 16;
        const uint16_t *a = rows_at(A, m0);
        const NextRows next = next_rows(A, m0, M, K, p1 - p0, 2); /* gate, then up */
        for (int64_t p = p0; p < p1; p++) {
            const char *pf = next.at + 2 * (p - p0) * next.lines_a_call * 64;
            block(a, A, w + p * panel, K2, bg[p - p0], g, NR * 4, two, pf, next.lines_a_step);
            block(a, A, w + (p + up) * panel, K2, bu[p - p0], u, NR * 4, two,
                  pf + next.lines_a_call * 64, next.lines_a_step);
            for (int64_t i = 0; i < r; i++) {
                const float *gi = g + i * NR, *ui = u + i * NR;
                const __m512 lo = silu_mul16(_mm512_load_ps(gi), _mm512_load_ps(ui));
                const __m512 hi = silu_mul16(_mm512_load_ps(gi + 16), _mm512_load_ps(ui + 16));
                const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
                _mm512_storeu_si512(y + (m0 + i) * n + p * NR, pair);
            }
        }
    }
}

/* The A operand of x: float32 rows rounded to tiles by every thread into `a` (row_blocks x 16
 * rows), or bfloat16 rows in place, the last 32-row block copied once, zero-padded, to `a`. */
static AOperand a_operand(const void *x, int64_t ldx, int x_bf16, uint16_t *a, int64_t M,
                          int64_t K) {
    if (!x_bf16) return (AOperand){a, 32, 64, K, NULL, 0};
    const int64_t m0 = (M - 1) / 32 * 32; /* the last block's first row */
    const uint16_t *xb = x;
    if (M - m0 == 32) return (AOperand){xb, 2, ldx * 2, ldx, NULL, 0};
    memset(a, 0, (size_t)(32 * ldx) * 2);
    for (int64_t i = m0; i < M; i++) memcpy(a + (i - m0) * ldx, xb + i * ldx, (size_t)K * 2);
    return (AOperand){xb, 2, ldx * 2, ldx, a, m0};
}

enum { STORE, ADD, SILU }; /* y = the linear; y += it; y = silu(gate) x up, bfloat16 */

/* x's A operand, then `panels` panels shared out in column blocks: the plain linear stored to
 * or added into float32 y (row stride ldy), or the fused gate/up product (column_block_silu)
 * over N / 2 gate panels to bfloat16 y. x: float32 (rounded to tiles first) or, x_bf16,
 * bfloat16 rows. */
static int run(const void *x, int64_t ldx, int x_bf16, const uint16_t *w, const float *bias,
               void *y, int64_t ldy, int64_t M, int64_t N, int64_t K, int threads, int mode) {
    const int silu = mode == SILU;
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    const int64_t row_blocks = (M + 15) / 16;
    const int64_t panels = silu ? N / 2 / NR : (N + NR - 1) / NR;
    const int64_t per_block = silu ? NB / 2 : NB; /* a gate panel brings its up panel */
    const size_t a_elems = x_bf16 ? (size_t)(32 * ldx) : (size_t)(row_blocks * 16) * (size_t)K;
    uint16_t *a = aligned_alloc(64, a_elems * 2);
    if (!a) return 1;
    const AOperand A = a_operand(x, ldx, x_bf16, a, M, K);
    /* rows that fit L2 as tiles stay there while each panel passes once (a panel a block);
     * more rows pass over blocks of up to NB panels held in L2 instead, as many blocks to
     * each thread (18 panels on 2 threads: 5 + 5 and 5 + 3, not 8 + 8 and 2) */
    const int64_t t = threads < 1 ? 1 : threads;
    const int64_t per_thread = (panels + t * per_block - 1) / (t * per_block);
    const int64_t nb =
        M * K * 2 <= L2_ROWS_BYTES ? 1 : (panels + t * per_thread - 1) / (t * per_thread);
    const int64_t col_blocks = (panels + nb - 1) / nb;
#pragma omp parallel num_threads(t)
    {
        if (!x_bf16) {
            const float *xf = x;
#pragma omp for schedule(static)
            for (int64_t mb = 0; mb < row_blocks; mb++) {
                const int64_t rows = M - mb * 16 < 16 ? M - mb * 16 : 16;
                to_tiles(xf + mb * 16 * ldx, ldx, a + mb * 16 * K, rows, K);
            }
        }
        amx_configure();
#pragma omp for schedule(static)
        for (int64_t cb = 0; cb < col_blocks; cb++) {
            const int64_t p0 = cb * nb, p1 = p0 + nb < panels ? p0 + nb : panels;
            if (silu)
                column_block_silu(&A, w, bias, y, M, N / 2, K, p0, p1);
            else
                column_block(&A, w, bias, y, ldy, mode == ADD, M, N, K, p0, p1);
        }
        _tile_release();
    }
    free(a);
    return 0;
}

/* y (M x N, float32, row stride ldy) = x W^T + b, or (add) y += x W^T + b; x float32 or,
 * x_bf16, bfloat16 rows. */
int small_gemm_amx(const void *x, int64_t ldx, int x_bf16, const uint16_t *w, const float *bias,
                   float *y, int64_t ldy, int add, int64_t M, int64_t N, int64_t K,
                   int threads) {
    return run(x, ldx, x_bf16, w, bias, y, ldy, M, N, K, threads, add ? ADD : STORE);
}

/* y (M x N/2, bfloat16) = silu(gate) * up of the fused gate/up linear (N columns: gate, then
 * up), N/2 a multiple of 32; small_gemm_bf16_silu() checks that and K first. */
int small_gemm_amx_silu(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                        const float *bias, uint16_t *y, int64_t M, int64_t N, int64_t K,
                        int threads) {
    if (N % (2 * NR) != 0 || K % 32 != 0) return 3; /* not this kernel's shape */
    return run(x, ldx, x_bf16, w, bias, y, N / 2, M, N, K, threads, SILU);
}

#else

int small_gemm_amx(const void *x, int64_t ldx, int x_bf16, const uint16_t *w, const float *bias,
                   float *y, int64_t ldy, int add, int64_t M, int64_t N, int64_t K,
                   int threads) {
    (void)x, (void)ldx, (void)x_bf16, (void)w, (void)bias, (void)y, (void)ldy, (void)add;
    (void)M, (void)N, (void)K, (void)threads;
    return 2; /* not built: small_gemm_bf16() checks amx_ready() first */
}

int small_gemm_amx_silu(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                        const float *bias, uint16_t *y, int64_t M, int64_t N, int64_t K,
                        int threads) {
    (void)x, (void)ldx, (void)x_bf16, (void)w, (void)bias, (void)y, (void)M, (void)N, (void)K;
    (void)threads;
    return 2;
}

#endif
