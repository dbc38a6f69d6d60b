/* The head layouts the attention kernels specialise: G query heads per KV head (1 to 8) by two
 * head_dims (C1, C2: 64 and 128 in vectors of the path's width); X(G, C) for each of the 16.
 *
 * Each layout's kernel is a function of its own (noinline) that the dispatching switch calls, so
 * that its loops have the registers and the stack frame to themselves. Inlined together into
 * the switch, GCC spilled accumulators that a build of the one layout keeps in registers (decode
 * over a bfloat16 cache, 18 query heads on 3 KV heads, Zen 4: 7.5 -> 6.3 ms; prefill's bfloat16
 * scores, 9 on 3: 5 of 24 accumulators every pair, 1 in the layout's own function, none in
 * paged_prefill.c's scores()), and the layouts' arrays added up on one stack frame (paged_prefill_amx.c:
 * 1.1 MB). */
#ifndef JOBRUNNER_HEAD_CASES_H
#define JOBRUNNER_HEAD_CASES_H

#define HEAD_CASES(X, C1, C2)                                                        \
    X(1, C1) X(2, C1) X(3, C1) X(4, C1) X(5, C1) X(6, C1) X(7, C1) X(8, C1) X(1, C2) \
    X(2, C2) X(3, C2) X(4, C2) X(5, C2) X(6, C2) X(7, C2) X(8, C2)

#endif
