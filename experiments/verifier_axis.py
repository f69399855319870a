"""Inference gain against a verifier's earliest-error F1: StepCo and Best-of-N per verifier, one plot.

For each verifier on the axis: its F1 (the JSON `reward_models.verifier_metrics` prints), a StepCo run and a
Best-of-N run of `inference.evaluate` with that verifier, all on the same problems as one greedy run.
It prints one markdown table (accuracy, tokens per problem counting the verifier's, and paired
bootstrap differences StepCo - Best-of-N and StepCo - greedy over the same problems) and, with
`--plot`, draws both differences against F1 with their intervals.

    python -m experiments.verifier_axis --greedy RUN --level NAME F1.json STEPCO_RUN BON_RUN [--level ...] \
        [--plot axis.png] [--json axis.json]

A level's F1.json is the stdout of `python -m reward_models.verifier_metrics --verifier V ...` (its `f1`).

Several sampling seeds: STEPCO_RUN and BON_RUN may each be a comma-separated list of runs, one per
seed, the same number in both (`stepco_s0,stepco_s1,stepco_s2`); seed k's StepCo run is paired with
seed k's Best-of-N run and with the one greedy run (greedy draws nothing). Accuracy and tokens are
then the means over the seeds, each seed's accuracy is listed, and a difference's interval resamples
problems, each with its mean over the seeds (the seeds share their problems).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from reasoning.jsonl import read_jsonl
from reasoning.stats import paired_over_seeds


def read_run(folder: str) -> dict[str, dict[str, Any]]:
    """id -> {correct, tokens}: a finished `inference.evaluate` run's rows (tokens with the verifier's)."""
    path = Path(folder) / "results.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results.jsonl (not an inference.evaluate run)")
    rows: dict[str, dict[str, Any]] = {}
    for r, n in zip(*read_jsonl(path)):
        try:
            u = r["usage"]
            tokens = u["prompt_tokens"] + u["completion_tokens"] + u.get("verifier_tokens", 0)
            rows[str(r["id"])] = {"correct": float(bool(r["correct"])), "tokens": tokens}
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path}: row {n}: not a results row ({err})") from None
    return rows


def read_f1(path: str) -> float | None:
    """The `f1` of one `reward_models.verifier_metrics` JSON output (the last JSON line of the file)."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise ValueError(f"{path}: no JSON line (expected reward_models.verifier_metrics's output)")
    result = json.loads(lines[-1])
    if "f1" not in result:
        raise ValueError(f"{path}: no 'f1' field (expected reward_models.verifier_metrics's output)")
    return result["f1"]


def read_runs(folders: str) -> list[dict[str, dict[str, Any]]]:
    """One `read_run` per comma-separated folder (one per sampling seed)."""
    runs = [read_run(f) for f in folders.split(",") if f]
    if not runs:
        raise ValueError(f"{folders!r}: no run named")
    return runs


def _paired(base: list[dict[str, dict[str, Any]]], other: list[dict[str, dict[str, Any]]],
            what: str, one_base: bool = False) -> dict[str, float]:
    """other - base, paired by problem; `one_base`: base is one run (greedy) paired with every seed.
    With several seeds each problem counts once, with its mean over the seeds, and the interval
    resamples problems: the seeds share their problems, so (seed, problem) pairs are not independent."""
    if one_base:
        base = base * len(other)
    if len(base) != len(other):
        raise ValueError(f"{what}: {len(other)} runs against {len(base)}: one per seed in each")
    ids = sorted(base[0])
    for b, o in zip(base, other):
        if set(b) != set(ids) or set(o) != set(ids):
            raise ValueError(f"{what}: the runs hold different problems ({len(b)} against {len(o)} ids)")
    return paired_over_seeds([{i: r["correct"] for i, r in b.items()} for b in base],
                             [{i: r["correct"] for i, r in o.items()} for o in other], ids)


def _summary(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Accuracy and tokens per problem, means over the runs (seeds); with several, each seed's accuracy."""
    accs = [sum(r["correct"] for r in rows.values()) / len(rows) for rows in runs]
    tokens = [sum(r["tokens"] for r in rows.values()) / len(rows) for rows in runs]
    out: dict[str, Any] = {"accuracy": sum(accs) / len(accs), "tokens_per_problem": sum(tokens) / len(tokens)}
    if len(runs) > 1:
        out["accuracy_per_seed"] = accs
    return out


def axis(greedy: str, levels: list[list[str]]) -> list[dict[str, Any]]:
    """One row per level: F1, both methods' accuracy and tokens, the paired differences."""
    g = [read_run(greedy)]
    out = []
    for name, f1_path, stepco_dirs, bon_dirs in levels:
        s, b = read_runs(stepco_dirs), read_runs(bon_dirs)
        out.append({"verifier": name, "f1": read_f1(f1_path), "greedy": _summary(g), "stepco": _summary(s),
                    "best_of_n": _summary(b), "stepco_minus_bon": _paired(b, s, f"{name}: StepCo against Best-of-N"),
                    "stepco_minus_greedy": _paired(g, s, f"{name}: StepCo against greedy", one_base=True)})
    return out


def _ci(d: dict[str, float]) -> str:
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def table(rows: list[dict[str, Any]]) -> str:
    seeds = any("accuracy_per_seed" in r["stepco"] for r in rows)
    lines = ["| verifier | F1 | StepCo | tokens | Best-of-N | tokens | StepCo − Best-of-N | StepCo − greedy |"
             + (" StepCo per seed | Best-of-N per seed |" if seeds else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if seeds else "")]
    for r in rows:
        f1 = "—" if r["f1"] is None else f"{r['f1']:.3f}"
        per_seed = ""
        if seeds:
            per_seed = "".join(" " + " / ".join(f"{a:.3f}" for a in r[k].get("accuracy_per_seed", [r[k]["accuracy"]]))
                               + " |" for k in ("stepco", "best_of_n"))
        lines.append(f"| `{r['verifier']}` | {f1} | {r['stepco']['accuracy']:.3f} | "
                     f"{r['stepco']['tokens_per_problem']:.0f} | {r['best_of_n']['accuracy']:.3f} | "
                     f"{r['best_of_n']['tokens_per_problem']:.0f} | {_ci(r['stepco_minus_bon'])} | "
                     f"{_ci(r['stepco_minus_greedy'])} |{per_seed}")
    if rows:
        g = rows[0]["greedy"]
        lines.append(f"\ngreedy: {g['accuracy']:.3f} at {g['tokens_per_problem']:.0f} tokens per problem")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r["f1"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, marker, shift in (("stepco_minus_bon", "StepCo − Best-of-N", "o", -0.004),
                                      ("stepco_minus_greedy", "StepCo − greedy", "^", 0.004)):
        xs = [r["f1"] + shift for r in pts]
        ys = [r[key]["diff"] for r in pts]
        err = [[r[key]["diff"] - r[key]["ci_low"] for r in pts], [r[key]["ci_high"] - r[key]["diff"] for r in pts]]
        ax.errorbar(xs, ys, yerr=err, fmt=marker, capsize=3, label=label)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("verifier's earliest-error F1 (greedy paths)")
    ax.set_ylabel("accuracy difference, paired [95% CI]")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--greedy", required=True, help="A greedy inference.evaluate run on the same problems.")
    p.add_argument("--level", nargs=4, action="append", required=True,
                   metavar=("NAME", "F1_JSON", "STEPCO_RUN", "BON_RUN"),
                   help="One verifier on the axis; several seeds' runs as RUN,RUN,... in both.")
    p.add_argument("--plot", help="Write the figure here (PNG).")
    p.add_argument("--json", help="Write the rows here.")
    args = p.parse_args(argv)
    try:
        rows = axis(args.greedy, args.level)
    except (OSError, ValueError) as err:  # DatasetError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
