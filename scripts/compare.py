#!/usr/bin/env python
"""Policies × inference methods on the same problems: the entry point of the `compare` package
(its docstring, or `--help`, describes the run).

    python scripts/compare.py [--config configs/compare/tiny_world.yaml] --out DIR [--quick]
        [--n_problems N] [--cache_dir D] [--workers W] [--set section.key=value ...] [--dry_run]
"""

import os
import sys
from pathlib import Path

# `python scripts/compare.py` puts scripts/ first on the path, where this file would shadow the
# package of the same name: the repository root goes first instead.
ROOT = str(Path(__file__).resolve().parents[1])
sys.path[:] = [ROOT] + [p for p in sys.path if p not in (ROOT, str(Path(__file__).resolve().parent))]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from compare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
