"""What an RL run changes step by step: every wrong step of the greedy responses, not only the first.

    python -m experiments.step_errors outputs/p44long/gold_s{0,1,2} outputs/p44long/exactown_s{0,1,2}

An answer is right only when every step is, so on long solutions a reward can cut a policy's
errors without moving its accuracy much. For each run folder (`eval_before_rows.jsonl` and
`eval_after_rows.jsonl` of `rl/ppo_step.py`) it checks every step of every greedy response with the
world's step checker (`reasoning.world.check_steps`) and counts the *own* errors of a response: the
wrong steps that are not `propagated` (wrong only because an earlier step was). It prints, before
and after: own errors per response and their paired change with a bootstrap interval, the share of
responses with 0, 1, 2 and 3 or more own errors, own errors per response by kind, and steps per
response. Runs named `NAME_s<seed>` are pooled per NAME (the pairs of every seed together).
The problems are rebuilt from each run's `run_config.json`. Writes nothing; `--json` prints one object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from experiments.name_use import run_problems
from reasoning.stats import paired_bootstrap_diff
from reasoning.steps import split_steps
from reasoning.world import check_steps
from rl.run_dir import RunDir

BUCKETS = ("0", "1", "2", "3+")


def own_errors(problem: dict[str, Any], completion: str, follow_carried: bool = False) -> tuple[list[str], int]:
    """The kinds of a response's own wrong steps (in order) and its number of steps. `follow_carried`:
    a step that carries an earlier error under another quantity's name is not an own error either
    (`reasoning.world.check_steps`)."""
    steps = split_steps(completion or "").steps
    checks = check_steps(problem, steps, follow_carried=follow_carried)
    return [c.kind for c in checks if not c.ok and c.kind != "propagated"], len(steps)


def profile(rows: dict[str, dict[str, Any]], problems: dict[str, dict[str, Any]],
            follow_carried: bool = False) -> dict[str, Any]:
    """Per response id: own error count; and the totals (by kind, by bucket, steps)."""
    counts: dict[str, int] = {}
    kinds: Counter[str] = Counter()
    buckets: Counter[str] = Counter()
    steps = 0
    for rid, row in rows.items():
        if rid not in problems:
            raise KeyError(f"row id {rid!r} is not one of the rebuilt world problems")
        errs, n = own_errors(problems[rid], row.get("completion") or "", follow_carried)
        counts[rid] = len(errs)
        kinds.update(errs)
        buckets[BUCKETS[min(len(errs), 3)]] += 1
        steps += n
    total = len(rows)
    return {"counts": counts, "errors_per_response": sum(counts.values()) / total,
            "share": {b: buckets[b] / total for b in BUCKETS},
            "by_kind": {k: v / total for k, v in kinds.most_common()}, "steps_per_response": steps / total}


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    ids = sorted(before["counts"])
    if ids != sorted(after["counts"]):
        raise ValueError("before and after rows cover different problems")
    return paired_bootstrap_diff([before["counts"][i] for i in ids], [after["counts"][i] for i in ids])


def _line(name: str, b: dict[str, Any], a: dict[str, Any], change: dict[str, float]) -> str:
    share = " / ".join(f"{b['share'][k]:.2f}→{a['share'][k]:.2f}" for k in BUCKETS)
    return (f"| {name} | {b['errors_per_response']:.3f} → {a['errors_per_response']:.3f} | "
            f"{change['diff']:+.3f} [{change['ci_low']:+.3f}, {change['ci_high']:+.3f}] | {share} | "
            f"{b['steps_per_response']:.2f} → {a['steps_per_response']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with eval_before_rows.jsonl and eval_after_rows.jsonl")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--follow_carried", action="store_true",
                        help="a step that does another needed quantity's computation on the wrong values the "
                             "response carries is not an own error, whatever name it gives (check_steps' "
                             "follow_carried; without it every such step counts again)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    pooled: dict[str, list[tuple[int, int]]] = defaultdict(list)
    try:
        for name in args.runs:
            run = Path(name)
            problems = run_problems(run, None, None, None)
            b = profile(RunDir(run).greedy_rows("before"), problems, args.follow_carried)
            a = profile(RunDir(run).greedy_rows("after"), problems, args.follow_carried)
            result[run.name] = {"before": b, "after": a, "change": compare(b, a)}
            m = re.fullmatch(r"(.+)_s\d+", run.name)
            if m:
                pooled[m.group(1)] += [(b["counts"][i], a["counts"][i]) for i in sorted(b["counts"])]
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    pools = {g: paired_bootstrap_diff([x for x, _ in p], [y for _, y in p]) for g, p in pooled.items()
             if sum(1 for n in result if re.fullmatch(rf"{re.escape(g)}_s\d+", n)) >= 2}
    if args.json:
        strip = {n: {k: ({kk: vv for kk, vv in v.items() if kk != "counts"} if k != "change" else v)
                     for k, v in r.items()} for n, r in result.items()}
        print(json.dumps({"runs": strip, "pooled": pools}))
        return 0
    print("| run | own errors per response, before → after | change [95% CI] | "
          "responses with 0 / 1 / 2 / 3+ own errors | steps per response |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        print(_line(name, r["before"], r["after"], r["change"]))
    for g, c in pools.items():
        print(f"| **{g}, seeds pooled** | | {c['diff']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | | |")
    print("\nown errors per response by kind (before → after):")
    for name, r in result.items():
        b, a = r["before"]["by_kind"], r["after"]["by_kind"]
        print(f"- {name}: " + ", ".join(f"{k} {b.get(k, 0):.3f}→{a.get(k, 0):.3f}" for k in sorted(set(b) | set(a))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
