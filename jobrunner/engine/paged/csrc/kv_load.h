/* Reading the KV cache's formats (engine/paged/kv_cache.py, engine/quant/kv.py) as float32,
 * shared by the decode and prefill attention kernels. A cache is float32, bfloat16 or float16,
 * or 8-bit codes (int8, or fp8 e4m3) with one float16 scale per (KV head, token) row. */
#ifndef JOBRUNNER_KV_LOAD_H
#define JOBRUNNER_KV_LOAD_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

enum { F32 = 0, BF16 = 1, F16 = 2, I8 = 3, FP8 = 4 }; /* cpu_kernels.DTYPES, QUANTIZED */

static inline int64_t elem_bytes(int dtype) {
    return dtype == F32 ? 4 : dtype <= F16 ? 2 : 1;
}

static inline float half_to_float(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24); /* zero or subnormal */
    } else {
        const uint32_t bits = (e == 31 ? 0xffu << 23 : (e + 112) << 23) | m << 13;
        memcpy(&f, &bits, sizeof(float));
    }
    return h & 0x8000u ? -f : f;
}

/* fp8 e4m3 as float16 bits: the same sign, exponent and mantissa fields shifted into place, a
 * value 2^-8 times the fp8 one (exponent bias 15 against 7), subnormals included. */
static inline uint16_t fp8_as_half(uint8_t b) {
    return (uint16_t)((b & 0x80u) << 8 | (b & 0x7fu) << 7);
}

/* The factor a row's load16 values are multiplied by: a quantized row's scale (fp8 times 2^8,
 * see fp8_as_half); 1 otherwise. The scale of the row at element `offset` sits at offset / hd. */
static inline float code_scale(int dtype, const uint16_t *scales, int64_t offset, int64_t hd) {
    if (dtype == I8) return half_to_float(scales[offset / hd]);
    if (dtype == FP8) return half_to_float(scales[offset / hd]) * 256.0f;
    return 1.0f;
}

#if defined(JR_AVX512)

/* 16 values at element `offset` of a cache as float32 (quantized: the codes, unscaled; fp8
 * codes come out 2^-8 times their value, see fp8_as_half). */
static inline __m512 load16(const void *base, int dtype, int64_t offset) {
    if (dtype == F32) return _mm512_loadu_ps((const float *)base + offset);
    if (dtype == I8 || dtype == FP8) {
        const __m128i bytes = _mm_loadu_si128((const __m128i *)((const uint8_t *)base + offset));
        if (dtype == I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
        const __m256i b = _mm256_cvtepu8_epi16(bytes); /* fp8_as_half, 16 lanes */
        const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8);
        const __m256i rest = _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7);
        return _mm512_cvtph_ps(_mm256_or_si256(sign, rest));
    }
    const __m256i half = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + offset));
    if (dtype == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    return _mm512_cvtph_ps(half);
}

#if defined(__AVX512BF16__)
/* Lane i: (a[i], b[i]) from two rows of 16 bfloat16 values, as vdpbf16ps reads a pair. */
static inline __m512i row_pairs(const uint16_t *a, const uint16_t *b) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)a));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)b));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}
#endif

#elif defined(JR_AVX2)

/* 8 values at element `offset` of a cache as float32, as load16 reads 16 (F16C converts). */
static inline __m256 load8(const void *base, int dtype, int64_t offset) {
    if (dtype == F32) return _mm256_loadu_ps((const float *)base + offset);
    if (dtype == I8 || dtype == FP8) {
        const __m128i bytes = _mm_loadl_epi64((const __m128i *)((const uint8_t *)base + offset));
        if (dtype == I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
        const __m128i b = _mm_cvtepu8_epi16(bytes); /* fp8_as_half, 8 lanes */
        const __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
        const __m128i rest = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7);
        return _mm256_cvtph_ps(_mm_or_si128(sign, rest));
    }
    const __m128i half = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + offset));
    if (dtype == BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    return _mm256_cvtph_ps(half);
}

#endif
#endif
