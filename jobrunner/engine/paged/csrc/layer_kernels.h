/* The entry points a decoder layer runs, as decode_layers.c calls them one after another:
 * declared once here and included by each source that defines one, so the compiler holds the
 * definitions and the calls to one signature. */
#pragma once
#include <stdint.h>

void rms_norm(const float *x, int64_t ld, const float *w, float eps, float *y, int64_t T,
              int64_t D, int threads);
void silu_mul(const float *gu, int64_t ld, float *y, int64_t T, int64_t n, int threads);
void small_gemm(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads);
/* rows a thread from which both linear kernels split a step's rows among the threads
 * (small_gemm.c keeps it; small_gemm_bf16.c reads it) */
int64_t small_gemm_split_rows(int64_t rows);
int rms_norm_bf16(const float *x, int64_t ld, const float *w, float eps, uint16_t *y, int64_t T,
                  int64_t D, int threads);
int small_gemm_bf16_rows(const uint16_t *x, int64_t ldx, const uint16_t *w, const float *bias,
                         float *y, int64_t M, int64_t N, int64_t K, int threads);
int small_gemm_bf16_add(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                        const float *bias, float *y, int64_t ldy, int64_t M, int64_t N,
                        int64_t K, int threads);
int small_gemm_bf16_silu(const void *x, int64_t ldx, int x_bf16, const uint16_t *w,
                         const float *bias, uint16_t *y, int64_t M, int64_t N, int64_t K,
                         int threads);
int small_gemm_bf16_fast(void);
int rope_kv_write(float *qkv, int64_t T, int64_t row, int64_t nh, int64_t nkv, int64_t hd,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  void *k_cache, void *v_cache, int dtype, const int64_t *slots,
                  int64_t slots_per_head, int threads);
int paged_decode_ld(const float *q, int64_t ldq, const void *k, const void *v,
                    const uint16_t *k_scale, const uint16_t *v_scale, int dtype,
                    const int64_t *tables, int64_t table_stride, const int64_t *ctx_lens,
                    int64_t b, int64_t nh, int64_t nkv, int64_t hd, int64_t num_blocks,
                    int64_t bs, float scale, float *out, int threads);
