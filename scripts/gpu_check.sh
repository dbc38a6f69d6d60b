#!/usr/bin/env bash
# The GPU checks, as one command for a lent GPU machine (15 minutes of device time a session,
# no network there):
#   1. the CUDA tests that need no weights (the Triton kernel and the engine on it, CUDA graphs
#      included, against HF generate), the scheduler and the block manager;
#   2. scripts/bench_gpu.py: the device's measured ceilings, the float32 oracle on each CUDA
#      path, HF static batches against the paged engine and decode against the roofline on a
#      Llama-3-8B-shaped model with random bfloat16 weights;
#   3. a whole job through the CLI (`jobrunner run`, model.device cuda, dtype auto) on a
#      SmolLM2-1.7B-shaped model with random weights and the built-in model's tokenizer
#      (scripts/random_model.py), over 4,096 distinct rows made from the sample prompts.
# Results land in $OUT: gpu.txt, tests.log, bench.log, bench_gpu.json, job.log, report.json,
# report.md, manifest.json (the run record: its load_parts split the job's start-up).
#
#   here, first:    bash scripts/gpu_check.sh --fetch-wheels   (into .whl/, git-ignored)
#   on the machine: bash scripts/gpu_check.sh                  (carry .whl)
#
# The device image (Python 3.12) holds torch, transformers, triton, pyarrow, typer, rich,
# pandas and nvidia-ml-py but not pydantic, polars or plotly: their wheels travel unpacked in
# one .whl/site.tar.xz (polars' runtime alone is a 54 MB wheel; a call carries 64 MiB in all),
# with the tokenizer in .whl/tokenizer/.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
polars==2.1.0 polars-runtime-32==2.1.0 plotly==7.1.0"
# STEPS picks and orders the steps (e.g. STEPS="bench tests", BENCH_ARGS="--phases breakdown",
# TESTS_ARGS="-k 8_bit");
# a smoke run on a CPU: DEVICE=cpu JOB_ROWS=32 JOB_SHAPE=smollm2-135m
# BENCH_ARGS="--device cpu --shape tiny --dtype float32 --rows 8 ..." bash scripts/gpu_check.sh
STEPS=${STEPS:-tests bench job} TESTS_TIMEOUT=${TESTS_TIMEOUT:-300} TESTS_ARGS=${TESTS_ARGS:-}
JOB_ROWS=${JOB_ROWS:-4096} JOB_SHAPE=${JOB_SHAPE:-smollm2-1.7b} DEVICE=${DEVICE:-cuda}
BENCH_ARGS=${BENCH_ARGS:-}

if [ "${1:-}" = "--fetch-wheels" ]; then
  set -e
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  rm -rf .whl && mkdir -p .whl/dl .whl/site
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl/dl $WHEELS
  for w in .whl/dl/*.whl; do python3 -m zipfile -e "$w" .whl/site; done
  tar -C .whl/site -cf - . | xz -6 -T0 > .whl/site.tar.xz
  rm -rf .whl/dl .whl/site
  .venv/bin/python - <<'EOF'
from transformers import AutoTokenizer
from jobrunner.engine.resolve import resolve_source
src = resolve_source("smollm2-135m-instruct")
AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file).save_pretrained(".whl/tokenizer")
EOF
  du -sh .whl/*
  exit
fi

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -f .whl/site.tar.xz ]; then
  mkdir -p /tmp/site && xz -dc .whl/site.tar.xz | tar -C /tmp/site -xf - || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 \
  | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers as t; print('torch', torch.__version__, \
'triton', triton.__version__, 'transformers', t.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
nproc | sed 's/^/cpus /' | tee -a "$OUT/gpu.txt"

# 1. the Triton kernel compiled (bfloat16 included) and the engine on it against HF generate,
# with and without CUDA graphs; then the scheduler and block manager (each kernel variant
# compiles on first use: about 6 s a test on an H200)
step_tests() {
# shellcheck disable=SC2086
timeout "$TESTS_TIMEOUT" python3 -m pytest -q -p no:cacheprovider tests/test_triton_attention.py \
  tests/test_block_manager.py tests/test_scheduler.py $TESTS_ARGS 2>&1 | tee "$OUT/tests.log"
}

# 2. the bench
step_bench() {
# shellcheck disable=SC2086
timeout 240 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.json" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log"
}

# 3. a whole job through the CLI
step_job() {
timeout 150 bash -c '
set -e
python3 scripts/random_model.py /tmp/gpu_model --shape "$2" --tokenizer .whl/tokenizer
python3 - "$1" <<EOF
import sys, pyarrow as pa, pyarrow.parquet as pq
n = int(sys.argv[1])
p = pq.read_table("data/samples/prompts.parquet", columns=["prompt"]).column("prompt").to_pylist()
rows = {"id": [f"r{i:07d}" for i in range(n)], "prompt": [f"Row {i}: {p[i % len(p)]}" for i in range(n)]}
pq.write_table(pa.table(rows), "/tmp/gpu_corpus.parquet")
EOF
cat > /tmp/gpu_job.yaml <<EOF
name: gpu-check
model: {source: /tmp/gpu_model, dtype: auto, max_model_len: 4096, device: $3}
input: {path: /tmp/gpu_corpus.parquet, id_column: id, prompt: {column: prompt}}
generation: {max_new_tokens: 128, ignore_eos: true}
output: {path: /tmp/gpu_job, format: parquet}
EOF
start=$(date +%s.%N)
python3 -m jobrunner run /tmp/gpu_job.yaml
echo "job wall $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s, process start to exit"
' _ "$JOB_ROWS" "$JOB_SHAPE" "$DEVICE" 2>&1 | tee "$OUT/job.log"
cp /tmp/gpu_job/report.json /tmp/gpu_job/report.md /tmp/gpu_job/manifest.json "$OUT/" 2>/dev/null
}

for step in $STEPS; do "step_$step"; done
exit 0
