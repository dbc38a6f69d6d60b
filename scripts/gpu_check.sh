#!/usr/bin/env bash
# The GPU checks, as one command for a lent GPU machine (15 minutes of device time a session):
# the CUDA tests that need no weights (the Triton kernel and the engine on it, CUDA graphs
# included), then scripts/bench_gpu.py (Llama-3-8B-shaped, random
# bfloat16 weights). Results land in $OUT: gpu.txt, tests.log, bench.log, bench_gpu.json.
#
#   here, first:    bash scripts/gpu_check.sh --fetch-wheels   (into .whl/, git-ignored)
#   on the machine: bash scripts/gpu_check.sh                  (carry .whl)
#
# The device image holds torch, transformers, pytest, numpy, yaml and nvidia-ml-py but not
# pydantic; its wheels (for that image's Python 3.12) travel in .whl.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5"

if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS && ls .whl
  exit
fi

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  2>&1 | tee -a "$OUT/gpu.txt"
# the Triton kernel compiled (bfloat16 included) and the engine on it against HF generate,
# with and without CUDA graphs; then the scheduler and block manager
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_triton_attention.py \
  tests/test_block_manager.py tests/test_scheduler.py 2>&1 | tee "$OUT/tests.log"
timeout 360 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench.log"
