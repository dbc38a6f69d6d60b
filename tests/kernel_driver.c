/* A command-line driver of the CPU kernels (jobrunner/engine/paged/csrc), for running a build
 * made for another ISA under an emulator: tests/test_aarch64_kernels.py cross-compiles it with
 * the kernels, runs it under qemu-aarch64 and compares its outputs with torch.
 *
 *   kernel_driver info            prints "<kernel_isa> <small_gemm_panel> <small_gemm_fast>"
 *   kernel_driver CASE.in ...     runs each case, writing its float32 output to CASE.out
 *
 * A case file is little-endian: an int64 kind, then the kind's int64 sizes, then its arrays in
 * the order read below (each as torch lays it out, contiguous).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kernel_isa(void);
int small_gemm_panel(void);
int small_gemm_fast(void);
void small_gemm(const float *x, int64_t ldx, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads);
int paged_decode(const float *q, const void *k, const void *v, const uint16_t *k_scale,
                 const uint16_t *v_scale, int dtype, const int64_t *tables,
                 int64_t table_stride, const int64_t *ctx_lens, int64_t b, int64_t nh,
                 int64_t nkv, int64_t hd, int64_t num_blocks, int64_t bs, float scale,
                 float *out, int threads);
void rms_norm(const float *x, int64_t ld, const float *w, float eps, float *y, int64_t T,
              int64_t D, int threads);
void silu_mul(const float *gu, int64_t ld, float *y, int64_t T, int64_t n, int threads);
void rope_inplace(float *x, int64_t T, int64_t H, int64_t hd, int64_t row_stride,
                  const float *cos_table, const float *sin_table, const int64_t *positions,
                  int threads);

enum { GEMM = 1, DECODE = 2, RMS_NORM = 3, SILU_MUL = 4, ROPE = 5 };

static void *read_array(FILE *f, int64_t bytes) {
    void *p = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!p || fread(p, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "short case file (%lld bytes wanted)\n", (long long)bytes);
        exit(2);
    }
    return p;
}

static void read_sizes(FILE *f, int64_t *v, int n) {
    int64_t *p = read_array(f, 8 * n);
    memcpy(v, p, 8 * (size_t)n);
    free(p);
}

static float read_float(FILE *f) {
    float *p = read_array(f, 4), x = *p;
    free(p);
    return x;
}

/* sizes: M, N, K, ldx, has_bias, threads; arrays: x (M, ldx), packed w, bias (N). */
static float *run_gemm(FILE *f, int64_t *count) {
    int64_t s[6];
    read_sizes(f, s, 6);
    const int64_t M = s[0], N = s[1], K = s[2], ldx = s[3], panel = small_gemm_panel();
    float *x = read_array(f, 4 * M * ldx);
    float *w = read_array(f, 4 * ((N + panel - 1) / panel) * panel * K);
    float *bias = s[4] ? read_array(f, 4 * N) : NULL;
    float *y = malloc(4 * (size_t)(M * N));
    small_gemm(x, ldx, w, bias, y, M, N, K, (int)s[5]);
    free(x), free(w), free(bias);
    *count = M * N;
    return y;
}

/* sizes: dtype, elem bytes, b, nh, nkv, hd, num_blocks, bs, table_stride, threads; then the
 * scale (float32); arrays: q, k cache, v cache, k and v scales (quantized only), tables, lens. */
static float *run_decode(FILE *f, int64_t *count) {
    int64_t s[10];
    read_sizes(f, s, 10);
    const int64_t dtype = s[0], elem = s[1], b = s[2], nh = s[3], nkv = s[4], hd = s[5];
    const int64_t num_blocks = s[6], bs = s[7], stride = s[8], rows = nkv * num_blocks * bs;
    const float scale = read_float(f);
    float *q = read_array(f, 4 * b * nh * hd);
    void *k = read_array(f, elem * rows * hd), *v = read_array(f, elem * rows * hd);
    uint16_t *ks = dtype >= 3 ? read_array(f, 2 * rows) : NULL;
    uint16_t *vs = dtype >= 3 ? read_array(f, 2 * rows) : NULL;
    int64_t *tables = read_array(f, 8 * b * stride), *lens = read_array(f, 8 * b);
    float *out = malloc(4 * (size_t)(b * nh * hd));
    if (paged_decode(q, k, v, ks, vs, (int)dtype, tables, stride, lens, b, nh, nkv, hd,
                     num_blocks, bs, scale, out, (int)s[9])) {
        fprintf(stderr, "paged_decode failed\n");
        exit(3);
    }
    free(q), free(k), free(v), free(ks), free(vs), free(tables), free(lens);
    *count = b * nh * hd;
    return out;
}

/* sizes: T, D, ld, threads; then eps (float32); arrays: x (T, ld), weight (D). */
static float *run_rms_norm(FILE *f, int64_t *count) {
    int64_t s[4];
    read_sizes(f, s, 4);
    const float eps = read_float(f);
    float *x = read_array(f, 4 * s[0] * s[2]), *w = read_array(f, 4 * s[1]);
    float *y = malloc(4 * (size_t)(s[0] * s[1]));
    rms_norm(x, s[2], w, eps, y, s[0], s[1], (int)s[3]);
    free(x), free(w);
    *count = s[0] * s[1];
    return y;
}

/* sizes: T, n, ld, threads; arrays: gate/up rows (T, ld). */
static float *run_silu_mul(FILE *f, int64_t *count) {
    int64_t s[4];
    read_sizes(f, s, 4);
    float *gu = read_array(f, 4 * s[0] * s[2]);
    float *y = malloc(4 * (size_t)(s[0] * s[1]));
    silu_mul(gu, s[2], y, s[0], s[1], (int)s[3]);
    free(gu);
    *count = s[0] * s[1];
    return y;
}

/* sizes: T, H, hd, row_stride, max_len, threads; arrays: x (T, row_stride), cos and sin
 * (max_len, hd), positions (T) int64. The output: x rotated, all of its (T, row_stride). */
static float *run_rope(FILE *f, int64_t *count) {
    int64_t s[6];
    read_sizes(f, s, 6);
    float *x = read_array(f, 4 * s[0] * s[3]);
    float *c = read_array(f, 4 * s[4] * s[2]), *sn = read_array(f, 4 * s[4] * s[2]);
    int64_t *pos = read_array(f, 8 * s[0]);
    rope_inplace(x, s[0], s[1], s[2], s[3], c, sn, pos, (int)s[5]);
    free(c), free(sn), free(pos);
    *count = s[0] * s[3];
    return x;
}

static void run_case(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    int64_t kind, count = 0;
    read_sizes(f, &kind, 1);
    float *y = kind == GEMM       ? run_gemm(f, &count)
               : kind == DECODE   ? run_decode(f, &count)
               : kind == RMS_NORM ? run_rms_norm(f, &count)
               : kind == SILU_MUL ? run_silu_mul(f, &count)
               : kind == ROPE     ? run_rope(f, &count)
                                  : NULL;
    fclose(f);
    if (!y) {
        fprintf(stderr, "%s: unknown kind %lld\n", path, (long long)kind);
        exit(2);
    }
    char out[4096];
    snprintf(out, sizeof out, "%.*s.out", (int)(strlen(path) - 3), path); /* CASE.in -> .out */
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(y, 4, (size_t)count, o) != (size_t)count || fclose(o) != 0) {
        perror(out);
        exit(2);
    }
    free(y);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "info") == 0) {
        printf("%s %d %d\n", kernel_isa(), small_gemm_panel(), small_gemm_fast());
        return 0;
    }
    for (int i = 1; i < argc; i++) run_case(argv[i]);
    return 0;
}
