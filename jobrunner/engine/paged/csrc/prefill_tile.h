/* What both prefill attention kernels (paged_prefill.c, paged_prefill_amx.c) share: a tile of
 * 16 query tokens held as the 16 lanes of a vector. */
#ifndef JOBRUNNER_PREFILL_TILE_H
#define JOBRUNNER_PREFILL_TILE_H
#include <stdint.h>

#include "isa.h"

/* A masked score, or a running max before the first key, where scores are powers of 2 (the AMX
 * path, and tile_bf16 in paged_prefill.c): finite, so exp2_16 of it less a real max is 0, not
 * NaN, and a max that starts there gives the first span's rescale factor 0. */
#define PREFILL_MASKED (-1e30f)

#if defined(JR_AVX512)
/* Lane qi's position start + qi; padding lanes take the last real one, L - 1 (their output is
 * not stored). */
static inline __m512i lane_positions(int64_t start, int64_t L) {
    const __m512i pos =
        _mm512_add_epi32(_mm512_set1_epi32((int)start),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_min_epi32(pos, _mm512_set1_epi32((int)(L - 1)));
}
#endif

#endif
