#!/usr/bin/env bash
# Creates .venv (if needed) with the toolkit and its test tools installed.
# On a CPU machine torch comes from torch==2.13.0 (a local CPU wheel where the machine ships one);
# constraints.txt (at the repository root) keeps every later install from replacing it with a
# multi-GB CUDA build, and keeps transformers, trl, peft and accelerate on the tested versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  python -m pip install -q -c constraints.txt "torch==2.13.0"
fi
python -m pip install -q -c constraints.txt -e ".[dev]"
