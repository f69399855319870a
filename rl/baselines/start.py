"""What both baselines do before any model loads: their settings parsed (one line and exit 2 for a bad
one), the PPO run's thread count, and the run folder."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from reasoning.threads import threads_for_baseline
from rl.ppo_config import ConfigError
from rl.run_dir import RunDir


def start_baseline(parse: Callable[[list[str] | None], tuple[Any, Any]],
                   argv: list[str] | None) -> tuple[Any, Any, RunDir] | None:
    """(PPO settings, the baseline's own, its run folder, created), or None after printing the
    settings' error in one line (the caller exits 2)."""
    try:
        args, own = parse(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    threads_for_baseline(args.num_threads)
    run = RunDir(args.output_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    return args, own, run
