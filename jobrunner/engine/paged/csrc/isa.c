/* The vector path this build of the kernels runs (isa.h), for cpu_kernels.py's log and tests. */
#include "isa.h"

const char *kernel_isa(void) {
#if defined(JR_AVX512)
    return "avx512";
#elif defined(JR_AVX2)
    return "avx2";
#elif defined(JR_NEON)
    return "neon";
#else
    return "scalar";
#endif
}
