/* y = x W^T + b with bfloat16 weights on AMX tiles (Sapphire Rapids, Emerald and Granite
 * Rapids): float32 x and y, float32 accumulation; small_gemm_bf16() hands it steps of
 * AMX_MIN_ROWS rows or more whose K is a multiple of 32.
 *
 * The weights are small_gemm_bf16.c's panels unchanged: (ceil(N/32), K/2, 32, 2) bfloat16, so
 * one k pair of a panel is 128 bytes and 16 k pairs of 16 of its columns are one B tile (16
 * rows of 64 bytes, stride 128). x is rounded to bfloat16 (round to nearest even, as the
 * vdpbf16ps path) a slice of rows at a time into row-major rows, 32 k per A tile row. A block
 * of 32 rows x one panel holds 2 x 2 float32 C tiles (16 x 16) over the whole of K, each A and
 * B tile feeding two tdpbf16ps (16 x 16 x 32 multiply-adds each); C starts from the bias.
 * Rows past M are zero in the slice and never stored; a short last panel or block goes through
 * a scratch tile.
 * Where Linux does not grant the tiles (amx.c), or the build lacks AMX, the vdpbf16ps path runs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"

#ifdef JR_AMX

#define NR 32        /* output columns per panel, as small_gemm_bf16.c */
#define MB 32        /* rows per block: two A tiles */
#define SLICE_BYTES (1024 * 1024) /* bfloat16 rows a slice: in L2 while every panel passes */

/* Tiles 0-3: C (16 rows of 16 float32), 4-5: A (16 rows of 32 bfloat16), 6-7: B (16 k pairs
 * of 16 columns). */

/* One block: `two` selects 32 rows (else 16) of bfloat16 rows a (stride lda bytes) against
 * panel w over K2 pairs, C from the 32 biases, stored to y (stride ldy bytes). */
static void block(const uint16_t *a, int64_t lda, const uint16_t *w, int64_t K2,
                  const float *bias, float *y, int64_t ldy, int two) {
    for (int i = 0; i < (two ? 32 : 16); i++) { /* y's lines requested for writing */
        __builtin_prefetch((char *)y + i * ldy, 1, 3);
        __builtin_prefetch((char *)y + i * ldy + 64, 1, 3);
    }
    _tile_loadd(0, bias, 0);
    _tile_loadd(1, bias + 16, 0);
    if (two) {
        _tile_loadd(2, bias, 0);
        _tile_loadd(3, bias + 16, 0);
        const char *a1 = (const char *)a + 16 * lda;
        for (int64_t k = 0; k < K2; k += 16) {
            _tile_loadd(4, a + 2 * k, lda);
            _tile_loadd(6, w + k * NR * 2, NR * 4);
            _tile_loadd(7, w + k * NR * 2 + NR, NR * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + 4 * k, lda);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(2, (char *)y + 16 * ldy, ldy);
        _tile_stored(3, (char *)y + 16 * ldy + 64, ldy);
    } else {
        for (int64_t k = 0; k < K2; k += 16) {
            _tile_loadd(4, a + 2 * k, lda);
            _tile_loadd(6, w + k * NR * 2, NR * 4);
            _tile_loadd(7, w + k * NR * 2 + NR, NR * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, y, ldy);
    _tile_stored(1, (char *)y + 64, ldy);
}

/* rows x K float32 (stride ldx) -> bfloat16 (rows, K), then zero rows up to `padded`. */
static void to_bf16_rows(const float *x, int64_t ldx, uint16_t *out, int64_t rows,
                         int64_t padded, int64_t K) {
    for (int64_t m = 0; m < rows; m++)
        for (int64_t k = 0; k < K; k += 32) {
            const __m512 lo = _mm512_loadu_ps(x + m * ldx + k), hi = _mm512_loadu_ps(x + m * ldx + k + 16);
            _mm512_storeu_si512(out + m * K + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    memset(out + rows * K, 0, (size_t)(padded - rows) * (size_t)K * 2);
}

/* One slice of `rows` rows (bfloat16 in a) against every panel, the panels split over threads. */
static void slice_panels(const uint16_t *a, const uint16_t *w, const float *bias, float *y,
                         int64_t rows, int64_t N, int64_t K, int threads) {
    const int64_t panels = (N + NR - 1) / NR, K2 = K / 2;
#pragma omp parallel num_threads(threads < 1 ? 1 : threads)
    {
        amx_configure();
        float scratch[MB * NR] __attribute__((aligned(64)));
        float b[NR] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
            for (int64_t j = 0; j < NR; j++) b[j] = bias && j < ncols ? bias[p * NR + j] : 0.0f;
            const uint16_t *wp = w + p * K2 * NR * 2;
            /* the next panel into L2, its lines spread over this panel's blocks */
            const char *next = p + 1 < panels ? (const char *)(wp + K2 * NR * 2) : 0;
            const int64_t lines = K2 * NR * 4 / 64, blocks = (rows + MB - 1) / MB;
            const int64_t per_block = (lines + blocks - 1) / blocks;
            for (int64_t m0 = 0; m0 < rows; m0 += MB) {
                const int64_t r = rows - m0 < MB ? rows - m0 : MB;
                if (next)
                    for (int64_t l = m0 / MB * per_block; l < (m0 / MB + 1) * per_block && l < lines; l++)
                        _mm_prefetch(next + l * 64, _MM_HINT_T1);
                const int two = r > 16, direct = ncols == NR && r == (two ? 32 : 16);
                float *out = direct ? y + m0 * N + p * NR : scratch;
                block(a + m0 * K, K * 2, wp, K2, b, out, direct ? N * 4 : NR * 4, two);
                if (!direct)
                    for (int64_t i = 0; i < r; i++)
                        memcpy(y + (m0 + i) * N + p * NR, scratch + i * NR, (size_t)ncols * 4);
            }
        }
        _tile_release();
    }
}

int small_gemm_amx(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y,
                   int64_t M, int64_t N, int64_t K, int threads) {
    int64_t slice = SLICE_BYTES / (K * 2) / MB * MB;
    if (slice < MB) slice = MB;
    if (slice > (M + MB - 1) / MB * MB) slice = (M + MB - 1) / MB * MB;
    uint16_t *a = aligned_alloc(64, (size_t)slice * (size_t)K * 2);
    if (!a) return 1;
    for (int64_t m0 = 0; m0 < M; m0 += slice) {
        const int64_t rows = M - m0 < slice ? M - m0 : slice;
        to_bf16_rows(x + m0 * ldx, ldx, a, rows, (rows + 15) / 16 * 16, K);
        slice_panels(a, w, bias, y + m0 * N, rows, N, K, threads);
    }
    free(a);
    return 0;
}

#else

int small_gemm_amx(const float *x, int64_t ldx, const uint16_t *w, const float *bias, float *y,
                   int64_t M, int64_t N, int64_t K, int threads) {
    (void)x, (void)ldx, (void)w, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)threads;
    return 2; /* not built: small_gemm_bf16() checks amx_ready() first */
}

#endif
