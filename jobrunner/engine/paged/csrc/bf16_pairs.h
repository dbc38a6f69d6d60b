/* bfloat16 pairs in AVX-512 registers, for the kernels whose products (vdpbf16ps, AMX tiles)
 * read two bfloat16 values as one 32-bit word: two float32 vectors rounded and interleaved
 * into pairs, and a 16 x 16 block of words transposed into the k-major or tile layouts. */
#ifndef JOBRUNNER_BF16_PAIRS_H
#define JOBRUNNER_BF16_PAIRS_H
#include "isa.h"

#if defined(JR_AVX512)
/* 16 x 16 32-bit words transposed in registers: r[i] lane j becomes r[j] lane i. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) { /* words within 2 x 2 blocks */
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) /* word pairs within 4 x 4 blocks */
        for (int j = 0; j < 2; j++) {
            r[i + 2 * j] = _mm512_unpacklo_epi64(t[i + j], t[i + j + 2]);
            r[i + 2 * j + 1] = _mm512_unpackhi_epi64(t[i + j], t[i + j + 2]);
        }
    for (int i = 0; i < 16; i += 8) /* 128-bit lanes within 8 x 8 blocks */
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) { /* 256-bit halves */
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD);
    }
}
#if defined(__AVX512BF16__)
/* Lane i: the bfloat16 pair (lo[i], hi[i]), lo in the low half, each rounded to the nearest
 * even: both rounded in one instruction, then the halves interleaved. */
static inline __m512i pairs_of(__m512 lo, __m512 hi) {
    const __m512i zip = _mm512_setr_epi32(0x100000, 0x110001, 0x120002, 0x130003, 0x140004,
                                          0x150005, 0x160006, 0x170007, 0x180008, 0x190009,
                                          0x1A000A, 0x1B000B, 0x1C000C, 0x1D000D, 0x1E000E,
                                          0x1F000F); /* word i: halves i and 16 + i */
    return _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}
#endif
#endif

#endif
