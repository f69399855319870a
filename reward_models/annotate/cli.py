"""`python -m reward_models.annotate`: the settings parsed, the annotation run, its summary printed."""

from __future__ import annotations

import json
import sys

from reasoning.benchmarks import DatasetError
from reward_models.annotate.base import AnnotateConfig, AnnotationError
from reward_models.annotate.run import annotate


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    parser = TrlParser((AnnotateConfig,), prog="python -m reward_models.annotate")
    (cfg,) = parser.parse_args_and_config(args=argv)
    try:
        summary = annotate(cfg)
    except (AnnotationError, DatasetError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":  # the console script's module runs as `python -m` too
    sys.exit(main())
