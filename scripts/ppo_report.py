"""A table of PPO runs on the same test problems: greedy accuracy before and after, the paired
bootstrap interval of each run's change, and of each run against a baseline run.

    python scripts/ppo_report.py outputs/ppo_compare/{outcome,step,gold,step_gold} --baseline outcome

Reads each run's `eval.json`, `eval_before_rows.jsonl` and `eval_after_rows.jsonl`, and
`metrics.jsonl` for the last updates' KL and steps per response. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasoning.stats import paired_bootstrap_diff  # noqa: E402
from rl.run_dir import RunDir  # noqa: E402


def _tail_mean(metrics: Path, key: str, last: int = 10) -> float:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    values = [r[key] for r in rows[-last:] if key in r]
    return sum(values) / len(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="PPO output directories")
    parser.add_argument("--baseline", default=None, help="name of the run the others are compared with")
    parser.add_argument("--resamples", type=int, default=2000)
    a = parser.parse_args()
    runs = {Path(r).name: Path(r) for r in a.runs}
    after = {name: RunDir(d).correct("after") for name, d in runs.items()}
    before = RunDir(next(iter(runs.values()))).correct("before")
    ids = sorted(set(before).intersection(*after.values()))
    head = "| run | greedy before | greedy after | change [95% CI] |"
    sep = "|---|---|---|---|"
    if a.baseline:
        head += f" vs {a.baseline} [95% CI] |"
        sep += "---|"
    head += " KL (last 10) | steps/response (last 10) |"
    sep += "---|---|"
    print(head)
    print(sep)
    b = [before[i] for i in ids]
    for name, d in runs.items():
        x = [after[name][i] for i in ids]
        change = paired_bootstrap_diff(b, x, resamples=a.resamples)
        line = (f"| {name} | {sum(b) / len(b):.3f} | {sum(x) / len(x):.3f} | "
                f"{change['diff']:+.3f} [{change['ci_low']:+.3f}, {change['ci_high']:+.3f}] |")
        if a.baseline:
            if name == a.baseline:
                line += " — |"
            else:
                base = [after[a.baseline][i] for i in ids]
                vs = paired_bootstrap_diff(base, x, resamples=a.resamples)
                line += f" {vs['diff']:+.3f} [{vs['ci_low']:+.3f}, {vs['ci_high']:+.3f}] |"
        metrics = RunDir(d).metrics
        kl, steps = _tail_mean(metrics, "objective/kl"), _tail_mean(metrics, "rollout/steps_per_response")
        line += f" {kl:.3f} | {steps:.2f} |"
        print(line)
    print(f"\n{len(ids)} problems, the same for every run; paired bootstrap, {a.resamples} resamples.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
