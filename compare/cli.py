"""The command line of `scripts/compare.py`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import compare
from compare.cells import evaluate_policy
from compare.config import DEFAULT_CONFIG, QUICK_CONFIG, ROOT, CompareError, from_dict, load_config
from compare.pipeline import plan, run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=compare.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None,
                   help=f"YAML recipe (default: the embedded default, {DEFAULT_CONFIG.relative_to(ROOT)})")
    p.add_argument("--out", required=True, help="Output directory (report.md, summary.json, the PNG, eval/, logs/)")
    p.add_argument("--quick", action="store_true",
                   help=f"Merge {QUICK_CONFIG.relative_to(ROOT)} over the config (smoke run)")
    p.add_argument("--n_problems", type=int, default=None, help="Override eval.n_problems")
    p.add_argument("--cache_dir", default=None, help="Override cache_dir")
    p.add_argument("--workers", type=int, default=None, help="Override workers")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="Override any config entry, e.g. --set eval.methods.stepco.threshold=0.6 (repeatable)")
    p.add_argument("--dry_run", action="store_true",
                   help="Print the plan (artefacts with their cache directories and status, cells) and exit")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)  # eval:<policy>[:<label>+...], subprocesses
    p.add_argument("--resolved", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.stage:
            if not args.stage.startswith("eval:") or not args.resolved:
                raise CompareError(f"--stage {args.stage}: expected eval:<policy> with --resolved")
            cfg = from_dict(json.loads(Path(args.resolved).read_text()))
            _, name, *group = args.stage.split(":", 2)
            evaluate_policy(cfg, name, Path(args.out), group[0].split("+") if group else None)
            return 0
        overrides: dict[str, Any] = {}
        if args.n_problems is not None:
            overrides.setdefault("eval", {})["n_problems"] = args.n_problems
        if args.cache_dir is not None:
            overrides["cache_dir"] = args.cache_dir
        if args.workers is not None:
            overrides["workers"] = args.workers
        cfg = load_config(args.config, args.quick, args.sets, overrides)
        if args.dry_run:
            print(json.dumps(plan(cfg), indent=2))
            return 0
        command = shlex.join(["python", "scripts/compare.py", *(argv if argv is not None else sys.argv[1:])])
        run(cfg, Path(args.out), command)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0

