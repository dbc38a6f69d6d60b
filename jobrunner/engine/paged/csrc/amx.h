/* AMX tiles (Sapphire Rapids, Emerald and Granite Rapids): what the kernels that use them share.
 * JR_AMX is defined where the build has AVX-512 BF16 and the AMX tile and bfloat16 instructions;
 * even then the tiles are used only after amx_ready() (Linux grants the tile state to a process
 * that asks) and while AMX is on (small_gemm_bf16_amx_rows(): JOBRUNNER_AMX_ROWS=0 turns it
 * off for the linears and attention alike). Every kernel configures the same tiles: 8 tiles of
 * 16 rows of 64 bytes (16 float32, or 32 bfloat16 as 16 pairs). */
#ifndef JOBRUNNER_AMX_H
#define JOBRUNNER_AMX_H
#include <stdint.h>
#include <string.h>

#include "isa.h"

#if defined(JR_AVX512) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && \
    defined(__AMX_BF16__) && defined(__linux__)
#define JR_AMX 1

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tile_config;

/* This thread's tiles: all 8 as 16 rows of 64 bytes. Release with _tile_release(). */
static inline void amx_configure(void) {
    amx_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}
#endif

/* 1 when this process may use the tiles (asked once; the answer holds for every thread). */
int amx_ready(void);

/* The row count from which bfloat16 linears take the tiles, after setting it to `rows` when
 * rows >= 0; 0 when AMX is off or not there (small_gemm_bf16.c). */
int64_t small_gemm_bf16_amx_rows(int64_t rows);

#endif
