#!/usr/bin/env bash
# The native kernels (paged engine and embeddings) built with AddressSanitizer and run under the
# tests that drive them directly and through the engine: a read or write past a tensor's memory
# (a row count, stride or block table the C code gets wrong) stops the run with ASan's report
# instead of passing on whatever the bytes held. The sanitized library has its own cache key
# (JOBRUNNER_KERNEL_CFLAGS is part of it), so the optimized one is left alone.
#   bash scripts/asan_kernels.sh [pytest args]   (default: the kernel and engine tests)
# AMX tile loads and masked vector loads are not instrumented; the plain loads and stores are.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
asan=$(${CC:-cc} -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "no libasan.so for ${CC:-cc} (apt-get install libasan8)" >&2; exit 2; }
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_cpu_kernels.py tests/test_prefill_kernel.py
    tests/test_attention.py tests/test_bf16_cpu.py tests/test_embed_kernels.py
    tests/test_paged_engine.py -q -x -p no:cacheprovider)
# torch and Python keep memory to exit and have their own allocators: leaks are not the question
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:symbolize=1:allocator_may_return_null=1
export JOBRUNNER_KERNEL_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1"
LD_PRELOAD="$asan" exec "$py" -m pytest "${tests[@]}"
