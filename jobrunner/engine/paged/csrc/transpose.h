/* A 16 x 16 block of 32-bit words transposed in AVX-512 registers, for the kernels that turn
 * rows of bfloat16 pairs into the k-major or tile layouts their products read. */
#ifndef JOBRUNNER_TRANSPOSE_H
#define JOBRUNNER_TRANSPOSE_H
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
#endif

#endif
