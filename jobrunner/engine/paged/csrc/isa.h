/* Which vector path the kernels compile: AVX-512 (16 floats a vector), AVX2 with FMA and F16C
 * (8 floats: Zen 2/3, Intel before Skylake-SP, most desktop CPUs), NEON on aarch64 (4 floats,
 * 32 registers: Graviton, Ampere, Grace; SVE is not used, its FMA throughput on Neoverse V1/V2
 * is NEON's), or plain C (any other ISA). Built with -march=native (-mcpu=native on aarch64),
 * so the path is this CPU's. */
#ifndef JOBRUNNER_ISA_H
#define JOBRUNNER_ISA_H
#include <stdint.h>

#if defined(__AVX512F__)
#define JR_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define JR_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define JR_NEON 1
#endif

#if defined(JR_AVX512) || defined(JR_AVX2)
#include <immintrin.h>
#endif

#ifdef JR_NEON
#include <arm_neon.h>
#endif

#ifdef JR_AVX2
/* Lanes 0..n-1 set (n in 0..8): the mask _mm256_maskload_ps / maskstore_ps take for a tail. */
static inline __m256i tail_mask8(int64_t n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane);
}

/* The sum and the max of a vector's 8 lanes. */
static inline float hadd8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
#endif

#endif
