#!/usr/bin/env bash
# The test command: set-up on a fresh machine, the lint and the public API's type check (settings in
# pyproject.toml), then the whole suite (CPU only, no network). Any failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy
.venv/bin/python -m pytest -q --durations=30 "$@"
