"""The RL comparison on one world: reward modes (and the TRL GRPO peer) over seeds, on the same
test problems, in one table and one plot.

    python scripts/rl_comparison.py outputs/ppo_compare/{step,outcome,gold,grpo_trl}_s{0,1,2} \
        --out outputs/ppo_compare/comparison

A run folder is `NAME_sSEED` (the name groups seeds) written by `rl/ppo_step.py` or
`rl/baselines/grpo_peer.py`: `eval.json`, `eval_before_rows.jsonl`, `eval_after_rows.jsonl` and
`metrics.jsonl` with probe rows (`probe/greedy_accuracy` every few updates). Writes OUT.md (the
table), OUT.json and OUT.png (probe greedy accuracy against rollouts: the mean over seeds, the
band from the lowest to the highest seed; beside it the same means against training seconds) and
prints the table. Per run: the greedy change on the test problems with its paired 95% interval; per
name: the mean change over seeds, its spread, the pooled interval (all seeds' rows paired by
problem), the rollouts at which the probe first stood 5 points above its start, seconds per update,
each seed's training seconds and sampled tokens (rollouts and Monte Carlo continuations), whether
each seed held (not hacked: the probe never more than 2 points below its start, steps per response
over the last ten updates within 20% of the first ten's), and the
difference in greedy accuracy after training against the first name on the command line, paired by
seed and problem over the seeds both have.

A run argument `NAME_sSEED@N` stands for that run at its checkpoint N (its greedy rows written by
`python -m rl.tools.checkpoint_curve --output_dir RUN`; its seconds, tokens and probe up to update N) and
is grouped as `NAME@N`: runs of different lengths compared at the same update.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasoning.stats import paired_bootstrap_diff  # noqa: E402
from rl.run_dir import RunDir  # noqa: E402


def _metric_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in RunDir(run).metrics.read_text().splitlines()]


def _probe(rows: list[dict], responses_per_update: int) -> list[tuple[int, float, float | None]]:
    """(rollouts, probe greedy accuracy, training seconds so far or None) at every probe row."""
    return [(row.get("rollouts", row["update"] * responses_per_update), row["probe/greedy_accuracy"],
             row.get("elapsed")) for row in rows if "probe/greedy_accuracy" in row]


def sampled_tokens(rows: list[dict]) -> float | None:
    """Every token a run sampled (rollouts, and Monte Carlo continuations where the estimator draws
    them): the sum of its updates' `rollout/tokens`; None for a run that does not log them."""
    counts = [row["rollout/tokens"] for row in rows if "rollout/tokens" in row]
    return sum(counts) if counts else None


HELD_PROBE_DROP = 0.02
HELD_STEPS_CHANGE = 0.20


def held(rows: list[dict], last: int = 10) -> dict:
    """Was the run's reward hacked? The probe's start and lowest greedy accuracy, and steps per
    response over the first and the last `last` updates (means: one update's 16 prompts differ in how
    many steps they need); `held` is True when the probe never fell more than 2 points below its start
    and steps per response stayed within 20% of the start (None when the run logs neither: a TRL
    baseline logs no steps)."""
    probe = [row["probe/greedy_accuracy"] for row in rows if "probe/greedy_accuracy" in row]
    steps = [row["rollout/steps_per_response"] for row in rows if "rollout/steps_per_response" in row]
    out = {"probe_start": probe[0] if probe else None, "probe_lowest": min(probe) if probe else None,
           "steps_first": sum(steps[:last]) / len(steps[:last]) if steps else None,
           "steps_last": sum(steps[-last:]) / len(steps[-last:]) if steps else None}
    if not probe or not steps:
        out["held"] = None
    else:
        out["held"] = (out["probe_lowest"] >= out["probe_start"] - HELD_PROBE_DROP - 1e-9
                       and abs(out["steps_last"] / out["steps_first"] - 1) <= HELD_STEPS_CHANGE + 1e-9)
    return out


def _held_cell(checks: list[dict]) -> str:
    def one(c: dict) -> str:
        if c["held"] is None:
            return "—"
        return (f"{'yes' if c['held'] else 'NO'} ({c['probe_lowest'] - c['probe_start']:+.2f}, "
                f"{c['steps_first']:.2f}→{c['steps_last']:.2f})")
    return "; ".join(one(c) for c in checks)


def run_and_update(arg: str) -> tuple[Path, int | None]:
    """A run argument: `RUN` (the run as it ended) or `RUN@N` (the run at its checkpoint N)."""
    m = re.fullmatch(r"(.+)@(\d+)", arg)
    return (Path(m.group(1)), int(m.group(2))) if m else (Path(arg), None)


def seconds_at(rows: list[dict], update: int, run: Path) -> float:
    """Training seconds when update `update` ended: the `elapsed` of its metrics rows (the update's
    row, which may carry the probe too, and a probe row of its own); ValueError when the run logged
    none (a TRL baseline's metrics)."""
    times = [float(row["elapsed"]) for row in rows if row.get("update") == update and "elapsed" in row]
    if not times:
        raise ValueError(f"{run}: no training seconds logged at update {update}")
    return max(times)


def against_first(first: dict[str, dict[str, float]], other: dict[str, dict[str, float]],
                  resamples: int) -> dict | None:
    """Greedy accuracy after training, `other` minus `first`, paired by (seed, problem) over the seeds
    both ran; None when they share no seed."""
    seeds = sorted(set(first) & set(other))
    x, y = [], []
    for seed in seeds:
        ids = sorted(set(first[seed]) & set(other[seed]))
        x += [first[seed][i] for i in ids]
        y += [other[seed][i] for i in ids]
    if not x:
        return None
    return {"seeds": seeds, **paired_bootstrap_diff(x, y, resamples=resamples)}


def _versus_cell(versus: dict | None) -> str:
    if versus is None:
        return "—"
    return f"{versus['diff']:+.3f} [{versus['ci_low']:+.3f}, {versus['ci_high']:+.3f}] ({len(versus['seeds'])} seeds)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True, help="path prefix of the .md, .json and .png written")
    parser.add_argument("--target", type=float, default=0.05, help="the probe gain whose rollouts are reported")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args(argv)
    groups: dict[str, list[tuple[Path, int | None]]] = defaultdict(list)
    for arg in args.runs:
        run, at = run_and_update(arg)
        if not RunDir(run).eval.exists():
            print(f"error: {run}: no {RunDir.eval} (not a finished run)", file=sys.stderr)
            return 2
        if at is not None and not RunDir(run).update_rows(at).exists():
            print(f"error: {arg}: no {RunDir(run).update_rows(at)}; evaluate the run's checkpoints first: "
                  f"python -m rl.tools.checkpoint_curve --output_dir {run}", file=sys.stderr)
            return 2
        m = re.fullmatch(r"(.+)_s(\d+)", run.name)
        groups[(m.group(1) if m else run.name) + ("" if at is None else f"@{at}")].append((run, at))
    result: dict[str, dict] = {}
    lines = ["| run | seeds | greedy before | greedy after (mean) | change per seed | mean change (min, max) | "
             "pooled change [95% CI] | rollouts to +5 on the probe | s/update | training s per seed | "
             "tokens sampled per seed (M) | "
             "held per seed (probe lowest − start; steps per response, first → last ten updates) | "
             "after − first [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    curves = {}
    after_rows: dict[str, dict[str, dict[str, float]]] = {}  # name -> seed -> problem -> correct
    first = next(iter(groups))
    for name, runs in groups.items():
        changes, befores, afters, pooled_b, pooled_a, reach, speed, per_seed = [], [], [], [], [], [], [], []
        seconds, tokens, checks = [], [], []
        for run, at in sorted(runs):
            ev = json.loads(RunDir(run).eval.read_text())
            rows = _metric_rows(run)
            if at is not None:  # the run as it stood at checkpoint `at`: its rows, updates, seconds and tokens
                rows = [row for row in rows if row.get("update", 0) <= at]
                try:
                    ev = {**ev, "updates": at, "train_seconds": seconds_at(rows, at, run)}
                except ValueError as err:
                    print(f"error: {err}", file=sys.stderr)
                    return 2
            b = RunDir(run).correct("before")
            a = RunDir(run).correct("after") if at is None else RunDir(run).correct_at(at)
            after_rows.setdefault(name, {})[run.name.rpartition("_s")[2]] = a
            ids = sorted(set(b) & set(a))
            x, y = [b[i] for i in ids], [a[i] for i in ids]
            d = paired_bootstrap_diff(x, y, resamples=args.resamples)
            changes.append(d["diff"])
            per_seed.append(f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]")
            befores.append(sum(x) / len(x))
            afters.append(sum(y) / len(y))
            pooled_b += x
            pooled_a += y
            speed.append(ev["train_seconds"] / ev["updates"])
            seconds.append(ev["train_seconds"])
            tokens.append(sampled_tokens(rows))
            points = _probe(rows, ev["responses_per_update"])
            curves.setdefault(name, []).append(points)
            start = points[0][1] if points else None
            hit = next((r for r, acc, _ in points if start is not None and acc - start >= args.target - 1e-9), None)
            reach.append(hit)
            checks.append(held(rows))
        pooled = paired_bootstrap_diff(pooled_b, pooled_a, resamples=args.resamples)
        mean = sum(changes) / len(changes)
        reached = ", ".join("—" if r is None else str(r) for r in reach)
        versus = against_first(after_rows[first], after_rows[name], args.resamples) if name != first else None
        result[name] = {"seeds": len(runs), "changes": changes, "mean_change": mean, "pooled": pooled,
                        "before": befores, "after": afters, "rollouts_to_target": reach,
                        "seconds_per_update": sum(speed) / len(speed), "train_seconds": seconds,
                        "tokens_sampled": tokens, "held": checks, "after_minus_first": versus}
        token_cell = ", ".join("—" if t is None else f"{t / 1e6:.2f}" for t in tokens)
        lines.append(f"| {name} | {len(runs)} | {sum(befores) / len(befores):.3f} | {sum(afters) / len(afters):.3f} | "
                     f"{'; '.join(per_seed)} | {mean:+.3f} ({min(changes):+.3f}, {max(changes):+.3f}) | "
                     f"{pooled['diff']:+.3f} [{pooled['ci_low']:+.3f}, {pooled['ci_high']:+.3f}] | {reached} | "
                     f"{sum(speed) / len(speed):.1f} | {', '.join(f'{x:,.0f}' for x in seconds)} | {token_cell} | "
                     f"{_held_cell(checks)} | {_versus_cell(versus)} |")
    table = "\n".join(lines)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # left: at equal rollouts; right: at equal wall time (each probe point at its mean training seconds
    # over the seeds), where an estimator that samples more per update pays for it
    fig, (ax, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    styles = ("-", "--", ":", "-.")  # a new line style after every 10 colours, so no two curves look alike
    for k, (name, runs) in enumerate(curves.items()):
        at = [{r: (acc, sec) for r, acc, sec in points} for points in runs]
        xs = sorted(set.intersection(*(set(seed) for seed in at)))  # the probe points every seed has
        if not xs:
            continue
        values = [[seed[x][0] for seed in at] for x in xs]
        mean = [sum(v) / len(v) for v in values]
        style = dict(marker="o", markersize=3, linestyle=styles[(k // 10) % len(styles)], color=f"C{k % 10}",
                     label=f"{name} ({len(runs)} seeds)")
        line, = ax.plot(xs, mean, **style)
        ax.fill_between(xs, [min(v) for v in values], [max(v) for v in values], alpha=0.15, color=line.get_color())
        timed = [(sum(seed[x][1] for seed in at) / len(at), m) for x, m in zip(xs, mean)
                 if all(seed[x][1] is not None for seed in at)]
        if timed:
            ax_time.plot([t for t, _ in timed], [m for _, m in timed], **style)
    ax.set_xlabel("rollouts (responses sampled)")
    ax.set_ylabel("greedy accuracy on the probe problems")
    ax_time.set_xlabel("training seconds (mean over seeds)")
    for a in (ax, ax_time):
        a.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
