"""Step-credit arms against a reference at equal generated tokens: the table of issue 53's item 5.

Each arm is a reward (or credit form) run with several seeds, every run a PPO output folder
(`eval.json`, `eval_after_rows.jsonl`, `metrics.jsonl`), all on the same evaluation problems and,
for a comparison at equal generated tokens, the same `--max_generated_tokens`:

    python -m experiments.step_credit_compare --arm gold=R0,R1,R2 --arm progress=P0,P1,P2 \\
        [--reference gold] [--json out.json]

Per arm it prints (markdown) the greedy accuracy after training per seed and their mean, the
change from before training, the tokens each run sampled (responses and continuations:
`generated_tokens`), and, against the reference arm:

- **minus the reference, paired**: seed k of the arm paired with seed k of the reference (the
  seeds' SFT policy and prompts are shared); each evaluation problem's correctness averaged over
  the seeds, the difference resampled over problems (a 95% percentile bootstrap);
- **tokens to the reference's accuracy** (sample efficiency, as PRIME and PAV report it): the
  reference's final probe accuracy (`probe/greedy_accuracy` at its last update, the mean over its
  seeds) is the target; for each run, the tokens sampled when its probe accuracy first reached it
  (the start, before any update, counts 0 tokens), or "not reached". The ratio is the reference's
  mean tokens to the target over the arm's, over the runs that reached it, with a 95% interval that
  resamples the seeds of both arms; a run that never reached it is counted and said.

A missing file or a run without the needed key is one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from reasoning.jsonl import DatasetError, read_jsonl
from reasoning.stats import paired_over_seeds


class CompareError(ValueError):
    pass


def _json(path: Path) -> Any:
    if not path.is_file():
        raise CompareError(f"{path}: no such file")
    return json.loads(path.read_text())


def read_run(folder: Path) -> dict[str, Any]:
    """One PPO run: its eval.json, its after rows by problem id, and its probe curve against tokens."""
    result = _json(folder / "eval.json")
    if "greedy_accuracy_after" not in result:
        raise CompareError(f"{folder / 'eval.json'}: no greedy_accuracy_after (a run with --eval_dataset none?)")
    rows_path = folder / "eval_after_rows.jsonl"
    if not rows_path.is_file():
        raise CompareError(f"{rows_path}: no such file")
    try:
        rows, _ = read_jsonl(rows_path)
        after = {r["id"]: float(bool(r["correct"])) for r in rows}
    except (DatasetError, KeyError, TypeError) as err:
        raise CompareError(f"{rows_path}: not greedy evaluation rows ({err})") from None
    metrics_path = folder / "metrics.jsonl"
    if not metrics_path.is_file():
        raise CompareError(f"{metrics_path}: no such file")
    curve: list[tuple[float, float]] = []
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if "probe/greedy_accuracy" not in row:
            continue
        if row.get("update") == 0:
            curve.append((0.0, float(row["probe/greedy_accuracy"])))
        elif "rollout/tokens_cumulative" in row:
            curve.append((float(row["rollout/tokens_cumulative"]), float(row["probe/greedy_accuracy"])))
    tokens = result.get("generated_tokens")
    if tokens is None:
        raise CompareError(f"{folder / 'eval.json'}: no generated_tokens (a run from before the count existed)")
    return {"folder": str(folder), "after": after, "accuracy": float(result["greedy_accuracy_after"]),
            "change": float(result.get("improvement", 0.0)), "tokens": float(tokens), "curve": curve}


def tokens_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The tokens at the first probe whose accuracy reaches `target`; None if none does."""
    return next((tokens for tokens, accuracy in curve if accuracy >= target - 1e-12), None)


def paired_minus(base: list[dict[str, Any]], other: list[dict[str, Any]], seed: int = 0) -> dict[str, float]:
    """other − base in greedy accuracy after, paired by seed and problem (each problem's mean over seeds)."""
    ids = sorted(set.intersection(*(set(r["after"]) for r in base + other)))
    if not ids:
        raise CompareError("the runs share no evaluation problem")
    return paired_over_seeds([r["after"] for r in base], [r["after"] for r in other], ids, seed=seed)


def efficiency(ref: list[dict[str, Any]], arm: list[dict[str, Any]], resamples: int = 2000,
               seed: int = 0) -> dict[str, Any]:
    """Tokens to the reference's final probe accuracy, per run, and the ratio reference / arm."""
    finals = [r["curve"][-1][1] for r in ref if r["curve"]]
    if len(finals) != len(ref):
        raise CompareError("a reference run logs no probe/greedy_accuracy (run it with --n_probe > 0)")
    target = sum(finals) / len(finals)
    ref_tokens = [tokens_to(r["curve"], target) for r in ref]
    arm_tokens = [tokens_to(r["curve"], target) for r in arm]
    out: dict[str, Any] = {"target": target, "reference_tokens": ref_tokens, "arm_tokens": arm_tokens,
                           "arm_not_reached": sum(t is None for t in arm_tokens)}
    reached_ref = [t for t in ref_tokens if t is not None]
    reached_arm = [t for t in arm_tokens if t is not None]
    if not reached_ref or not reached_arm or min(reached_arm) <= 0:
        out["ratio"] = None
        return out

    def ratio(a: list[float], b: list[float]) -> float:
        return (sum(a) / len(a)) / max(sum(b) / len(b), 1e-9)

    rng = random.Random(seed)
    draws = sorted(ratio([rng.choice(reached_ref) for _ in reached_ref], [rng.choice(reached_arm) for _ in reached_arm])
                   for _ in range(resamples))
    out.update(ratio=ratio(reached_ref, reached_arm), ratio_ci_low=draws[int(0.025 * (resamples - 1))],
               ratio_ci_high=draws[int(0.975 * (resamples - 1))])
    return out


def compare(arms: dict[str, list[Path]], reference: str) -> list[dict[str, Any]]:
    runs = {name: [read_run(f) for f in folders] for name, folders in arms.items()}
    ref = runs[reference]
    rows = []
    for name, arm in runs.items():
        row: dict[str, Any] = {"arm": name, "seeds": len(arm), "accuracy": [r["accuracy"] for r in arm],
                               "accuracy_mean": sum(r["accuracy"] for r in arm) / len(arm),
                               "change": [r["change"] for r in arm], "tokens": [r["tokens"] for r in arm]}
        if name != reference:
            if len(arm) != len(ref):
                raise CompareError(f"--arm {name}: {len(arm)} runs, the reference {reference} has {len(ref)}: "
                                   "seeds are paired one to one")
            row["minus_reference"] = paired_minus(ref, arm)
            row["efficiency"] = efficiency(ref, arm)
        rows.append(row)
    return rows


def _seeds(values: list[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def table(rows: list[dict[str, Any]], reference: str) -> str:
    lines = [f"| arm | greedy after per seed (mean) | change per seed | tokens per seed | minus {reference}, paired "
             "[95% CI] | tokens to its accuracy per seed | ratio [95% CI] |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["arm"], f"{_seeds(row['accuracy'], '.3f')} ({row['accuracy_mean']:.3f})",
                 _seeds(row["change"], "+.3f"), _seeds(row["tokens"], ",.0f")]
        if "minus_reference" in row:
            d, e = row["minus_reference"], row["efficiency"]
            reached = " / ".join("not reached" if t is None else f"{t:,.0f}" for t in e["arm_tokens"])
            ratio = "n/a" if e["ratio"] is None else (f"{e['ratio']:.2f}x [{e['ratio_ci_low']:.2f}, "
                                                       f"{e['ratio_ci_high']:.2f}]")
            cells += [f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]", reached, ratio]
        else:
            cells += ["(reference)", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _arm(spec: str) -> tuple[str, list[Path]]:
    name, sep, folders = spec.partition("=")
    if not sep or not name or not folders:
        raise CompareError(f"--arm {spec!r}: give NAME=RUN[,RUN...]")
    return name, [Path(f) for f in folders.split(",") if f]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", required=True, help="NAME=RUN[,RUN...]: one run folder per seed")
    ap.add_argument("--reference", default=None, help="the arm the others are measured against (default: the first)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        arms = dict(_arm(spec) for spec in args.arm)
        reference = args.reference or next(iter(arms))
        if reference not in arms:
            raise CompareError(f"--reference {reference!r} is not an --arm ({', '.join(arms)})")
        rows = compare(arms, reference)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(rows, reference))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
