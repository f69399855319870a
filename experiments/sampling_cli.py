"""The command-line flags of the scripts that sample a world policy K times per problem
(`world_headroom.py`, `reward_agreement.py`), declared and checked in one place."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_sampling_args(parser: argparse.ArgumentParser, n: int) -> None:
    """--policy, --n (problems), --k (samples each), --temperature, --max_new_tokens, --seed,
    --batch_size and --out."""
    parser.add_argument("--policy", required=True)
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max_new_tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--out", default=None)


def sampling_args_error(args: argparse.Namespace, min_k: int = 1) -> str | None:
    """What is wrong with those flags, in one line, or None."""
    if args.n < 1 or args.k < min_k or args.temperature <= 0:
        return f"--n must be >= 1, --k >= {min_k} and --temperature > 0"
    if not (Path(args.policy) / "config.json").exists():
        return f"--policy {args.policy}: no model there (config.json missing)"
    return None
