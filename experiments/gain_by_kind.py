"""Where an RL run's greedy gain on the world comes from, and where it is lost: the change split by
the decisions a noisy teacher misreads, and the relation-direction errors before and after.

    python experiments/gain_by_kind.py outputs/ppo_noisy/gold_s{0,1,2} [--reference outputs/sft_clean_v]

For each run folder (`eval_before_rows.jsonl` and `eval_after_rows.jsonl` of `rl/ppo_step.py` or
`rl/baselines/grpo_peer.py`) it prints one line per part of the world test problems: those with an
inverse phrasing, those with a stale-count trap (`reasoning.world.misreadings_of`; a problem with
both is in both), those with neither, and all of them. Each line has greedy accuracy before and
after, the problems won (wrong before, right after) and lost (right before, wrong after), and the
paired bootstrap interval of the change. Runs named `NAME_s<seed>` are also pooled per NAME (mean of
the seeds' changes, the interval over the pooled pairs).

Then the earliest-error kinds of the wrong answers before and after, recomputed with the current
checker (so stored runs read like new ones): `misread_inverse` (an inverse phrasing computed with
the operation its words name), `misread_direct` (its mirror: a directly phrased relation computed
with the inverse operation), `misread_stale`, and the rest. `--reference POLICY` adds an SFT
policy's own greedy rows (`POLICY/eval_rows.jsonl`, written by `rl.sft`) as a line of its own, its
change counted against the first run's starting policy: for instance the same model taught by the
clean teacher, what the model learns about each decision from gold demonstrations.

The problems are rebuilt from the run's `run_config.json` (`--policy` for runs without one, as in
`experiments/name_use.py`). Writes nothing; `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.name_use import run_problems  # noqa: E402
from reasoning.stats import paired_bootstrap_diff  # noqa: E402
from reasoning.steps import split_steps  # noqa: E402
from reasoning.world import error_kind, misreadings_of  # noqa: E402
from rl.run_dir import RunDir, rows_by_id  # noqa: E402

PARTS = ("inverse", "stale", "neither", "all")
DIRECTION = ("misread_inverse", "misread_direct", "misread_stale")


def part_of(problem: dict[str, Any]) -> set[str]:
    """The parts a problem belongs to: its misreading kinds, or `neither`, and `all`."""
    kinds = set(misreadings_of(problem))
    return (kinds or {"neither"}) | {"all"}


def error_mix(rows: dict[str, dict[str, Any]], problems: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Earliest-error kinds of the wrong answers among `rows`, by the current checker."""
    mix: Counter[str] = Counter()
    for rid, row in rows.items():
        if rid not in problems:
            raise KeyError(f"row id {rid!r} is not one of the rebuilt world problems "
                           "(another world seed, n_eval or policy world?)")
        if not row.get("correct"):
            steps = split_steps(row.get("completion") or "").steps
            mix[error_kind(problems[rid], steps) or "right_steps_wrong_grade"] += 1
    return dict(mix.most_common())


def by_part(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]],
            problems: dict[str, dict[str, Any]], resamples: int) -> dict[str, dict[str, Any]]:
    """Per part: n, accuracy before and after, won, lost, the paired change and its interval."""
    if set(before) != set(after):
        raise ValueError(f"before and after rows cover different problems ({len(before)} against {len(after)})")
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rid in before:
        if rid not in problems:
            raise KeyError(f"row id {rid!r} is not one of the rebuilt world problems")
        for part in part_of(problems[rid]):
            pairs[part].append((float(bool(before[rid].get("correct"))), float(bool(after[rid].get("correct")))))
    out = {}
    for part in PARTS:
        xs = pairs.get(part, [])
        if not xs:
            continue
        b, a = [x for x, _ in xs], [y for _, y in xs]
        out[part] = {"n": len(xs), "before": sum(b) / len(b), "after": sum(a) / len(a),
                     "won": sum(1 for x, y in xs if y > x), "lost": sum(1 for x, y in xs if x > y),
                     "pairs": xs, **paired_bootstrap_diff(b, a, resamples=resamples)}
    return out


def _pooled(runs: dict[str, dict[str, Any]], resamples: int) -> dict[str, dict[str, Any]]:
    """Runs named NAME_s<seed> pooled per NAME (two or more seeds): means of the counts, and the
    paired interval over every seed's pairs together."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in runs:
        m = re.fullmatch(r"(.+)_s\d+", name)
        if m:
            groups[m.group(1)].append(name)
    pooled = {}
    for group, names in groups.items():
        if len(names) < 2:
            continue
        pooled[f"{group} (pooled, {len(names)} seeds)"] = {
            part: {"n": sum(runs[n][part]["n"] for n in names),
                   "before": sum(runs[n][part]["before"] for n in names) / len(names),
                   "after": sum(runs[n][part]["after"] for n in names) / len(names),
                   "won": sum(runs[n][part]["won"] for n in names) / len(names),
                   "lost": sum(runs[n][part]["lost"] for n in names) / len(names),
                   **paired_bootstrap_diff([x for n in names for x, _ in runs[n][part]["pairs"]],
                                           [y for n in names for _, y in runs[n][part]["pairs"]],
                                           resamples=resamples)}
            for part in runs[names[0]]}
    return pooled


def _print_tables(table: dict[str, dict[str, Any]], mixes: dict[str, dict[str, int]]) -> None:
    print("| run | part | problems | greedy before | after | won | lost | change [95% CI] |")
    print("|---|---|---|---|---|---|---|---|")
    for key, parts in table.items():
        for part, d in parts.items():
            won = f"{d['won']:.1f}" if isinstance(d["won"], float) else d["won"]
            lost = f"{d['lost']:.1f}" if isinstance(d["lost"], float) else d["lost"]
            print(f"| {key} | {part} | {d['n']} | {d['before']:.3f} | {d['after']:.3f} | {won} | {lost} "
                  f"| {d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] |")
    print()
    print("| greedy errors of | " + " | ".join(DIRECTION) + " | other kinds | wrong answers |")
    print("|---|" + "---|" * (len(DIRECTION) + 2))
    for key, mix in mixes.items():
        rest = sum(v for k, v in mix.items() if k not in DIRECTION)
        print(f"| {key} | " + " | ".join(str(mix.get(k, 0)) for k in DIRECTION) + f" | {rest} | {sum(mix.values())} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with eval_before_rows.jsonl and eval_after_rows.jsonl")
    parser.add_argument("--reference", nargs="*", default=[],
                        help="SFT policy folders whose eval_rows.jsonl (rl.sft) to show beside the runs")
    parser.add_argument("--policy", help="the starting policy, for runs without run_config.json")
    parser.add_argument("--world_seed", type=int)
    parser.add_argument("--n_eval", type=int)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        print("error: --resamples must be at least 1", file=sys.stderr)
        return 2
    runs: dict[str, dict[str, Any]] = {}
    mixes: dict[str, dict[str, int]] = {}
    try:
        problems: dict[str, dict[str, Any]] = {}
        for name in args.runs:
            run = Path(name)
            problems = run_problems(run, args.policy, args.world_seed, args.n_eval)
            before, after = RunDir(run).greedy_rows("before"), RunDir(run).greedy_rows("after")
            runs[run.name] = by_part(before, after, problems, args.resamples)
            if "before" not in mixes:
                mixes["before"] = error_mix(before, problems)
                first_before = before
            elif {k: r.get("correct") for k, r in before.items()} != \
                    {k: r.get("correct") for k, r in first_before.items()}:
                mixes[f"{run.name} before"] = error_mix(before, problems)  # another starting policy
            mixes[run.name] = error_mix(after, problems)
        for name in args.reference:
            ref = rows_by_id(Path(name) / "eval_rows.jsonl")
            if set(ref) != set(first_before):
                raise ValueError(f"{name}/eval_rows.jsonl covers other problems than {args.runs[0]} "
                                 f"({len(ref)} against {len(first_before)})")
            label = f"{Path(name).name} (reference)"
            runs[label] = by_part(first_before, ref, problems, args.resamples)
            mixes[label] = error_mix(ref, problems)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    pooled = _pooled(runs, args.resamples)
    table = {**runs, **pooled}
    if args.json:
        print(json.dumps({"parts": {k: {p: {f: v for f, v in d.items() if f != "pairs"} for p, d in parts.items()}
                                    for k, parts in table.items()},
                          "error_mix": mixes}, indent=1))
        return 0
    _print_tables(table, mixes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
