/* e^x for x <= 0, scalar and 16 lanes (AVX-512), 8 (AVX2) or 4 (NEON) at a time, shared by the kernels that need it
 * (softmax in paged_decode.c, the sigmoid in act_norm.c). */
#ifndef JOBRUNNER_VEXP_H
#define JOBRUNNER_VEXP_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

/* exp for x <= 0 (softmax after subtracting the max), about 1 ulp: e^x = 2^n e^r with
 * n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts) and e^r by a degree-5 polynomial;
 * the constants are shared by the scalar exp_neg and the vector exp_neg16. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
static const float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_neg(float x) {
    if (x < -87.0f) return 0.0f;
    float n = floorf(x * EXP_LOG2E + 0.5f);
    float r = x - n * EXP_LN2_HI - n * EXP_LN2_LO;
    float p = EXP_POLY[0];
    for (int i = 1; i < 6; i++) p = p * r + EXP_POLY[i];
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(float));
    return p * scale;
}

#if defined(JR_AVX512)

/* e^x for x <= 0, lane-wise (exp_neg's reduction and polynomial); lanes below -87 give ~1e-38. */
static inline __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* 2^x lane-wise for finite x <= 8, to 3e-6 relative (for weights rounded to bfloat16 next,
 * whose own rounding is 2^-9): r = x - floor(x) in one vreduceps, 2^r by a degree-4 fit on
 * [0, 1), and vscalefps multiplies by 2^floor(x) itself (x below -150 gives 0). 7 instructions
 * with the subtraction before it, against exp_neg16's 12. */
static inline __m512 exp2_16(__m512 x) {
    const __m512 r = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(1.352060307e-2f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.203742906e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.414274961e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.930066347e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.000002503e+0f));
    return _mm512_scalef_ps(p, x);
}

#elif defined(JR_AVX2)

/* e^x for x <= 0, lane-wise (exp_neg's reduction and polynomial); lanes below -87 give ~1e-38.
 * 2^n is built in the exponent field: n >= -126 there, so it is a normal float. */
static inline __m256 exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#elif defined(JR_NEON)

/* exp_neg8 with 4 lanes (n rounded half to even, as there). */
static inline float32x4_t exp_neg4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, EXP_LOG2E));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI)); /* x - n ln2_hi */
    r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = vfmaq_f32(vdupq_n_f32(EXP_POLY[i]), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), vmulq_f32(p, r), r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

#endif
#endif
