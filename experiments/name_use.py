"""How a world policy names the people its steps compute for, before and after RL.

    python experiments/name_use.py outputs/ppo_noisy/{gold,outcome_likmean}_s0 [--policy outputs/sft_noisy]

A world step reads `Ava has 6 - 2 = 4 marbles.`: the name is the policy's own record of which
quantity it computes, and the world's checker judges the computation apart from it (a right
computation under another person's name is a *naming slip*). RL gets no signal from the name, so
nothing holds those tokens' entropy up; this script shows what happened to them. For each run
folder (`eval_before_rows.jsonl` and `eval_after_rows.jsonl` of `rl/ppo_step.py` or
`rl/baselines/grpo_peer.py`) and each of the two, it prints:

- `one_name`: the share of greedy paths with two or more computation steps whose steps all carry
  the same name;
- `top_name`: the most used name and its share of all computation steps' names;
- `naming_slips`: right computation steps under another person's name, over all right computation
  steps (the checker's `naming_slip`);
- `unknown_quantity_errors`: wrong answers whose earliest error names a quantity the problem does
  not have (what a collapsed name turns other errors into).

The world test problems are rebuilt from the run's `run_config.json` (`policy`, `world_seed`,
`n_eval`); a run without one (the TRL peer) needs `--policy` (and `--world_seed`, `--n_eval` where
they differ from 0 and 500). Writes nothing; `--json` prints the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasoning.steps import split_steps  # noqa: E402
from reasoning.world import check_steps, error_kind, generate, world_config_of  # noqa: E402

_NAMED = re.compile(r"^([A-Z][a-z]+) (?:now )?has ")
_ANSWER = re.compile(r"<ans>|answer is", re.IGNORECASE)


def step_names(steps: list[str]) -> list[str]:
    """The names computation steps attach, in order (answer and `Together they` steps carry none)."""
    return [m.group(1) for m in (_NAMED.match(s.strip()) for s in steps) if m]


def name_use(rows: list[dict[str, Any]], problems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures above for greedy `rows` ({id, completion, correct}) of the world `problems` by id."""
    names: Counter[str] = Counter()
    multi = one = right = slips = unknown = 0
    for row in rows:
        problem = problems.get(row["id"])
        if problem is None:
            raise KeyError(f"row id {row['id']!r} is not one of the rebuilt world problems "
                           "(another world seed, n_eval or policy world?)")
        steps = split_steps(row.get("completion") or "").steps
        used = step_names(steps)
        names.update(used)
        if len(used) >= 2:
            multi += 1
            one += len(set(used)) == 1
        for step, check in zip(steps, check_steps(problem, steps)):
            if check.ok and check.kind == "correct" and not _ANSWER.search(step):
                right += 1
                slips += check.naming_slip
        if not row.get("correct") and error_kind(problem, steps) == "unknown_quantity":
            unknown += 1
    total = sum(names.values())
    top, top_n = names.most_common(1)[0] if names else (None, 0)
    return {"paths": len(rows), "multi_step_paths": multi, "one_name": one / multi if multi else None,
            "top_name": top, "top_name_share": top_n / total if total else None,
            "right_steps": right, "naming_slips": slips / right if right else None,
            "unknown_quantity_errors": unknown}


def run_problems(run: Path, policy: str | None, world_seed: int | None, n_eval: int | None) -> dict[str, dict]:
    """The world test problems a run was evaluated on, by id, rebuilt from its `run_config.json`
    (the arguments fill in what a run without one, such as the TRL peer's, does not say)."""
    stored = json.loads((run / "run_config.json").read_text()) if (run / "run_config.json").exists() else {}
    if stored.get("eval_dataset", "world") != "world":
        raise ValueError(f"{run}: evaluated on {stored['eval_dataset']!r}, not the world")
    policy = policy or stored.get("policy") or stored.get("model_name_or_path")
    if policy is None:
        raise ValueError(f"{run} has no run_config.json naming its policy: pass --policy (the policy it "
                         "started from)")
    seed = world_seed if world_seed is not None else stored.get("world_seed", 0)
    n = n_eval if n_eval is not None else stored.get("n_eval", 500)
    return {r["id"]: r for r in generate("test", n, seed, world_config_of(policy))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with eval_before_rows.jsonl and eval_after_rows.jsonl")
    parser.add_argument("--policy", help="the starting policy, for runs without run_config.json")
    parser.add_argument("--world_seed", type=int)
    parser.add_argument("--n_eval", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    result: dict[str, dict[str, Any]] = {}
    try:
        for name in args.runs:
            run = Path(name)
            problems = run_problems(run, args.policy, args.world_seed, args.n_eval)
            for when in ("before", "after"):
                path = run / f"eval_{when}_rows.jsonl"
                if not path.exists():
                    raise ValueError(f"{path} does not exist")
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                result[f"{run.name} {when}"] = name_use(rows, problems)
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print("| run | multi-step paths | one name | top name (share) | naming slips | unknown_quantity errors |")
    print("|---|---|---|---|---|---|")
    fmt = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
    for key, r in result.items():
        print(f"| {key} | {r['multi_step_paths']} | {fmt(r['one_name'])} "
              f"| {r['top_name']} ({fmt(r['top_name_share'])}) "
              f"| {fmt(r['naming_slips'])} ({r['right_steps']} right steps) | {r['unknown_quantity_errors']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
