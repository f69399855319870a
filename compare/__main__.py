"""`python -m compare` (and the `steprl-compare` console script): the same CLI as scripts/compare.py,
for an installed toolkit, which has no scripts/ folder."""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from compare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
