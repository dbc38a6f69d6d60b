/* The plain decode path's helpers (paged_decode.c: load_row, dot, softmax_rows) on NEON vectors,
 * for aarch64: a cache row converted 8 values at a time (float16 by the hardware's conversion,
 * exact as half_to_float), dot products in 4 chains of 4 lanes, the softmax's exponentials 4
 * lanes at a time (exp_neg4), and the weighted sum of V rows with its outputs in registers. */
#ifndef JOBRUNNER_DECODE_NEON_H
#define JOBRUNNER_DECODE_NEON_H
#include <math.h>
#include <stdint.h>

#include "kv_load.h"
#include "vexp.h"

/* 8 values at element `offset` of a cache as float32, in lo and hi (quantized: the codes,
 * unscaled; fp8 2^-8 times its value, as load16 gives them). */
static inline void load8_neon(const void *base, int dtype, int64_t offset, float32x4_t *lo,
                              float32x4_t *hi) {
    if (dtype == BF16) {
        const uint16x8_t h = vld1q_u16((const uint16_t *)base + offset);
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        return;
    }
    if (dtype == I8) {
        const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)base + offset));
        *lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        *hi = vcvtq_f32_s32(vmovl_high_s16(w));
        return;
    }
    uint16x8_t h;
    if (dtype == FP8) { /* fp8_as_half, 8 lanes */
        const uint16x8_t b = vmovl_u8(vld1_u8((const uint8_t *)base + offset));
        h = vorrq_u16(vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x80)), 8),
                      vshlq_n_u16(vandq_u16(b, vdupq_n_u16(0x7f)), 7));
    } else {
        h = vld1q_u16((const uint16_t *)base + offset);
    }
    const float16x8_t f = vreinterpretq_f16_u16(h);
    *lo = vcvt_f32_f16(vget_low_f16(f));
    *hi = vcvt_high_f32_f16(f);
}

/* One value of a cache as load8_neon gives it. */
static inline float load1(const void *base, int dtype, int64_t i) {
    if (dtype == BF16) {
        const uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(float));
        return f;
    }
    if (dtype == F16) return half_to_float(((const uint16_t *)base)[i]);
    if (dtype == I8) return (float)((const int8_t *)base)[i];
    return half_to_float(fp8_as_half(((const uint8_t *)base)[i]));
}

/* The hd values of the row at element `offset` as float32: in place for a float32 cache, else
 * converted into dst (quantized rows times their scale). */
static inline const float *load_row_neon(int dtype, const void *base, const uint16_t *scales,
                                         int64_t offset, int64_t hd, float *dst) {
    if (dtype == F32) return (const float *)base + offset;
    const float s = code_scale(dtype, scales, offset, hd);
    int64_t i = 0;
    for (; i + 8 <= hd; i += 8) {
        float32x4_t lo, hi;
        load8_neon(base, dtype, offset + i, &lo, &hi);
        vst1q_f32(dst + i, vmulq_n_f32(lo, s));
        vst1q_f32(dst + i + 4, vmulq_n_f32(hi, s));
    }
    for (; i < hd; i++) dst[i] = load1(base, dtype, offset + i) * s;
    return dst;
}

static inline float dot(const float *a, const float *b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f),
                          vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int c = 0; c < 4; c++)
            acc[c] = vfmaq_f32(acc[c], vld1q_f32(a + i + 4 * c), vld1q_f32(b + i + 4 * c));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void softmax_rows(float *scores, int64_t rows, int64_t L) {
    for (int64_t j = 0; j < rows; j++) {
        float *s = scores + j * L, m = -INFINITY;
        int64_t t = 0;
        float32x4_t mx = vdupq_n_f32(-INFINITY), sum = vdupq_n_f32(0.0f);
        for (; t + 4 <= L; t += 4) mx = vmaxq_f32(mx, vld1q_f32(s + t));
        m = vmaxvq_f32(mx);
        for (; t < L; t++) m = s[t] > m ? s[t] : m;
        const float32x4_t mv = vdupq_n_f32(m);
        for (t = 0; t + 4 <= L; t += 4) {
            const float32x4_t e = exp_neg4(vsubq_f32(vld1q_f32(s + t), mv));
            sum = vaddq_f32(sum, e);
            vst1q_f32(s + t, e);
        }
        float total = vaddvq_f32(sum);
        for (; t < L; t++) {
            s[t] = exp_neg(s[t] - m);
            total += s[t];
        }
        const float inv = 1.0f / total;
        for (t = 0; t < L; t++) s[t] *= inv;
    }
}

/* The weighted sum of V rows, o[j] = sum over t of p[j * L + t] * V_t for the g query heads of
 * one KV head, with each head's outputs in registers: CB of its hd / 4 vectors a pass, the G * CB
 * accumulators, CB V vectors and the G weights within the 32 registers. A span of tokens at a
 * time: their V rows (converted to float32 once, if the cache is not) stay in L1 across the
 * passes, and o, zeroed by the caller, carries the sums between spans. The plain loop kept o in
 * memory: a load and a store with every FMA. */
typedef struct {
    int dtype;
    const void *v;
    const uint16_t *v_scale;
    const int64_t *table;
    int64_t bs, hd, head_base, L;
    const float *p; /* (g, L) softmax weights */
    float *o;       /* (g, hd) */
} VPass;

enum { V_SPAN = 32, V_MAX_HD = 256 }; /* a span's converted rows: 32 KiB at most */

static inline __attribute__((always_inline)) void v_span(const VPass *P, const float **rows,
                                                         int64_t t0, int64_t n, const int G,
                                                         const int CB) {
    for (int64_t c0 = 0; c0 < P->hd; c0 += 4 * CB) {
        float32x4_t a[8][8];
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++) a[j][c] = vld1q_f32(P->o + j * P->hd + c0 + 4 * c);
        for (int64_t tt = 0; tt < n; tt++) {
            float32x4_t v[8];
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++) v[c] = vld1q_f32(rows[tt] + c0 + 4 * c);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++) {
                const float32x4_t pj = vdupq_n_f32(P->p[j * P->L + t0 + tt]);
#pragma GCC unroll 8
                for (int c = 0; c < CB; c++) a[j][c] = vfmaq_f32(a[j][c], pj, v[c]);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
#pragma GCC unroll 8
            for (int c = 0; c < CB; c++) vst1q_f32(P->o + j * P->hd + c0 + 4 * c, a[j][c]);
    }
}

static inline __attribute__((always_inline)) void v_pass(const VPass *P, const int G,
                                                         const int CB) {
    float buf[V_SPAN * V_MAX_HD] __attribute__((aligned(64)));
    const float *rows[V_SPAN];
    int64_t blk = 0, pos = 0;
    for (int64_t t0 = 0; t0 < P->L; t0 += V_SPAN) {
        const int64_t n = P->L - t0 < V_SPAN ? P->L - t0 : V_SPAN;
        for (int64_t tt = 0; tt < n; tt++) {
            const int64_t off = P->head_base + (P->table[blk] * P->bs + pos) * P->hd;
            rows[tt] = load_row_neon(P->dtype, P->v, P->v_scale, off, P->hd, buf + tt * P->hd);
            if (++pos == P->bs) pos = 0, blk++;
        }
        v_span(P, rows, t0, n, G, CB);
    }
}

/* Vectors of a head per pass, by G: the widest whose registers fit (the accumulators, the V
 * vectors and G weights, which the compiler computes together; two left spare: at G 6 with 4 it
 * spilled accumulators). One per G keeps the build short. */
static const int V_BLOCK[9] = {0, 8, 8, 4, 4, 4, 2, 2, 2};

#define V_CASE(G) \
    case G: v_pass(P, G, V_BLOCK[G]); return 1;

/* 1 when the register-resident pass handled the weighted V sum (up to 8 query heads per KV head,
 * head_dim up to 256 and a multiple of 4 times the pass: 64 and 128 always); 0: the caller's
 * plain loop. */
static int v_pass_neon(const VPass *P, int64_t g) {
    if (g < 1 || g > 8 || P->hd > V_MAX_HD || (P->hd / 4) % V_BLOCK[g] != 0) return 0;
    switch (g) { V_CASE(1) V_CASE(2) V_CASE(3) V_CASE(4) V_CASE(5) V_CASE(6) V_CASE(7) V_CASE(8) }
    return 0;
}

#endif
