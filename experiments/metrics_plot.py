"""Per-update curves of chosen metrics from PPO runs' metrics.jsonl, one panel per metric, one line
per run. A lab tool for the results pages:

    python -m experiments.metrics_plot RUN_DIR [RUN_DIR ...] --metrics rollout/accuracy,objective/kl --out FIG.png

`--x rollout/tokens_cumulative` draws them against the tokens sampled so far (responses and
continuations) instead of the update: runs compared at equal generated tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curves(run: Path, metrics: list[str], x: str = "update") -> dict[str, tuple[list[float], list[float]]]:
    """Each metric's (x values, values) from the run's update lines that log both (probe-only lines
    skipped); `x` is "update" or another metrics.jsonl key."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/update" in r and x in r]
    return {m: ([r[x] for r in rows if m in r], [float(r[m]) for r in rows if m in r]) for m in metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--metrics", required=True, help="comma list of metrics.jsonl keys")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--title", default="")
    ap.add_argument("--x", default="update", help="the x axis: update, or a metrics.jsonl key such as "
                                                  "rollout/tokens_cumulative")
    args = ap.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file():
            print(f"error: {run / 'metrics.jsonl'}: no such file", file=sys.stderr)
            return 2
    data = {run: curves(run, metrics, args.x) for run in args.runs}
    for m in metrics:
        if not any(data[run][m][0] for run in args.runs):
            print(f"error: --metrics: no run logs {m!r}" + (f" beside --x {args.x!r}" if args.x != "update" else ""),
                  file=sys.stderr)
            return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for run in args.runs:
            x, y = data[run][m]
            ax.plot(x, y, marker=".", label=run.name)
        ax.set_title(m, fontsize=10)
        ax.set_xlabel(args.x)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
