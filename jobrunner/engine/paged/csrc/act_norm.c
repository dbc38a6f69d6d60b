/* RMSNorm and SiLU-gated products in one pass each, float32, for CPUs.
 *
 * torch runs HF's RMSNorm as six passes over the activations (pow, mean, add, rsqrt, two muls)
 * and the MLP's silu(gate) * up as two: about 10% of a prefill-heavy job. These read their input
 * once and write their output once.
 *
 * rms_norm: y = x / sqrt(mean(x^2) + eps) * w per row, the mean in float32 as HF computes it.
 * silu_mul: y = silu(g) * u with g, u the two halves of a fused gate/up row;
 * silu(g) = g * sigmoid(g), sigmoid from one e^(-|g|) (vexp.h) so no lane overflows.
 * Rows may be strided (`ld`, in floats); outputs are contiguous.
 */
#include <math.h>
#include <stdint.h>

#include "layer_kernels.h"
#include "silu.h"
#include "vexp.h"

#define PARALLEL_ROWS 16 /* fewer rows than this run on one thread (a decode step's norm: ~2 us) */

#if defined(JR_AVX512)

/* 1 / sqrt(mean(x^2) + eps) of one row. */
static inline float rms_inv(const float *x, float eps, int64_t D) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __mmask16 tail = (__mmask16)((1u << (D - i)) - 1);
    const __m512 vt = _mm512_maskz_loadu_ps(tail, x + i);
    acc = _mm512_fmadd_ps(vt, vt, acc);
    return 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)D + eps);
}

static void rms_row(const float *x, const float *w, float eps, float *y, int64_t D) {
    const __m512 vinv = _mm512_set1_ps(rms_inv(x, eps, D));
    const __mmask16 tail = (__mmask16)((1u << (D % 16)) - 1);
    int64_t i;
    for (i = 0; i + 16 <= D; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv),
                                              _mm512_loadu_ps(w + i)));
    const __m512 xt = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), vinv);
    _mm512_mask_storeu_ps(y + i, tail, _mm512_mul_ps(xt, _mm512_maskz_loadu_ps(tail, w + i)));
}

#if defined(__AVX512BF16__)
#define NORM_BF16 1
/* rms_row's values rounded to bfloat16 (to nearest even, as the linears round their rows). */
static void rms_row_bf16(const float *x, const float *w, float eps, uint16_t *y, int64_t D) {
    const __m512 vinv = _mm512_set1_ps(rms_inv(x, eps, D));
    const __mmask16 tail = (__mmask16)((1u << (D % 16)) - 1);
    int64_t i;
    for (i = 0; i + 16 <= D; i += 16) {
        const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv),
                                       _mm512_loadu_ps(w + i));
        _mm256_storeu_si256((__m256i *)(y + i), (__m256i)_mm512_cvtneps_pbh(r));
    }
    const __m512 xt = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), vinv);
    const __m512 r = _mm512_mul_ps(xt, _mm512_maskz_loadu_ps(tail, w + i));
    _mm256_mask_storeu_epi16(y + i, tail, (__m256i)_mm512_cvtneps_pbh(r));
}
#endif

static void silu_mul_row(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    const __m512 r = silu_mul16(_mm512_maskz_loadu_ps(tail, g + i), _mm512_maskz_loadu_ps(tail, u + i));
    _mm512_mask_storeu_ps(y + i, tail, r);
}

#elif defined(JR_AVX2)

static void rms_row(const float *x, const float *w, float eps, float *y, int64_t D) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); /* two chains: FMA latency */
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(v0, v0, acc0);
        acc1 = _mm256_fmadd_ps(v1, v1, acc1);
    }
    for (; i + 8 <= D; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc0 = _mm256_fmadd_ps(v, v, acc0);
    }
    const __m256i tail = tail_mask8(D - i);
    const __m256 vt = _mm256_maskload_ps(x + i, tail);
    acc0 = _mm256_fmadd_ps(vt, vt, _mm256_add_ps(acc0, acc1));
    const float inv = 1.0f / sqrtf(hadd8(acc0) / (float)D + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= D; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv),
                                              _mm256_loadu_ps(w + i)));
    const __m256 xt = _mm256_mul_ps(_mm256_maskload_ps(x + i, tail), vinv);
    _mm256_maskstore_ps(y + i, tail, _mm256_mul_ps(xt, _mm256_maskload_ps(w + i, tail)));
}

static inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 abs_g = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    const __m256 e = exp_neg8(_mm256_sub_ps(zero, abs_g));
    const __m256 neg = _mm256_cmp_ps(g, zero, _CMP_LT_OQ);
    const __m256 num = _mm256_blendv_ps(one, e, neg); /* g < 0: e / (1 + e) */
    const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

static void silu_mul_row(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    const __m256i tail = tail_mask8(n - i);
    const __m256 r = silu_mul8(_mm256_maskload_ps(g + i, tail), _mm256_maskload_ps(u + i, tail));
    _mm256_maskstore_ps(y + i, tail, r);
}

#elif defined(JR_NEON)

static void rms_row(const float *x, const float *w, float eps, float *y, int64_t D) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                          vdupq_n_f32(0.0f)}; /* four chains: FMA latency */
    int64_t i = 0;
    for (; i + 16 <= D; i += 16)
        for (int c = 0; c < 4; c++) {
            const float32x4_t v = vld1q_f32(x + i + 4 * c);
            acc[c] = vfmaq_f32(acc[c], v, v);
        }
    for (; i + 4 <= D; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        acc[0] = vfmaq_f32(acc[0], v, v);
    }
    float ss = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < D; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (i = 0; i + 4 <= D; i += 4)
        vst1q_f32(y + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), inv), vld1q_f32(w + i)));
    for (; i < D; i++) y[i] = x[i] * inv * w[i];
}

static inline float32x4_t silu_mul4(float32x4_t g, float32x4_t u) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t e = exp_neg4(vnegq_f32(vabsq_f32(g)));
    const uint32x4_t neg = vcltq_f32(g, vdupq_n_f32(0.0f));
    const float32x4_t num = vbslq_f32(neg, e, one); /* g < 0: e / (1 + e) */
    return vmulq_f32(vmulq_f32(g, vdivq_f32(num, vaddq_f32(one, e))), u);
}

static void silu_mul_row(const float *g, const float *u, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, silu_mul4(vld1q_f32(g + i), vld1q_f32(u + i)));
    if (i == n) return;
    float gt[4] = {0}, ut[4] = {0}, yt[4]; /* the tail through a zero-padded vector */
    for (int64_t j = i; j < n; j++) gt[j - i] = g[j], ut[j - i] = u[j];
    vst1q_f32(yt, silu_mul4(vld1q_f32(gt), vld1q_f32(ut)));
    for (int64_t j = i; j < n; j++) y[j] = yt[j - i];
}

#else

static inline float sigmoid(float g) {
    const float e = exp_neg(-fabsf(g));
    return g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

static void rms_row(const float *x, const float *w, float eps, float *y, int64_t D) {
    float ss = 0.0f;
    for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) y[i] = x[i] * inv * w[i];
}

static void silu_mul_row(const float *g, const float *u, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

#endif

/* x: (T, D) with row stride ld; w: (D); y: (T, D) contiguous. */
void rms_norm(const float *x, int64_t ld, const float *w, float eps, float *y, int64_t T,
              int64_t D, int threads) {
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) \
    if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) rms_row(x + t * ld, w, eps, y + t * D, D);
}

/* gu: (T, 2n) with row stride ld, gate then up; y: (T, n) contiguous. */
void silu_mul(const float *gu, int64_t ld, float *y, int64_t T, int64_t n, int threads) {
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) \
    if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) silu_mul_row(gu + t * ld, gu + t * ld + n, y + t * n, n);
}

/* rms_norm() with y rounded to bfloat16, for rows a linear takes as bfloat16 (small_gemm_amx.c):
 * the same bits as rms_norm() then its rounding. Returns 1 where the build has no AVX-512
 * BF16 (the caller uses rms_norm()). */
int rms_norm_bf16(const float *x, int64_t ld, const float *w, float eps, uint16_t *y, int64_t T,
                  int64_t D, int threads) {
#ifdef NORM_BF16
#pragma omp parallel for num_threads(threads < 1 ? 1 : threads) schedule(static) \
    if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) rms_row_bf16(x + t * ld, w, eps, y + t * D, D);
    return 0;
#else
    (void)x, (void)ld, (void)w, (void)eps, (void)y, (void)T, (void)D, (void)threads;
    return 1;
#endif
}
