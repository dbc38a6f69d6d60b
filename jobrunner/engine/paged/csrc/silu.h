/* silu(g) * u on 16 float32 lanes (AVX-512), shared by the SiLU-gated product (act_norm.c) and
 * the linears that apply it to a fused gate/up projection as they store (small_gemm_amx.c,
 * small_gemm_bf16.c): the same instructions, so the paths give the same bits. silu(g) =
 * g * sigmoid(g), the sigmoid from one e^(-|g|) (vexp.h) so no lane overflows. */
#ifndef JOBRUNNER_SILU_H
#define JOBRUNNER_SILU_H
#include "vexp.h"

#if defined(JR_AVX512)
static inline __m512 silu_mul16(__m512 g, __m512 u) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_blend_ps(neg, one, e); /* g < 0: e / (1 + e) */
    const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
    return _mm512_mul_ps(_mm512_mul_ps(g, sig), u);
}
#endif

#endif
