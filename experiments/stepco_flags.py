"""Why verify-then-revise helps or not on the world: StepCo's (or PathCo's) answer changes and where
its verifier flagged the first path, judged by the world's checker.

    python experiments/stepco_flags.py runs/noisy/stepco_resample [more run folders] [--out flags.json]

For each run folder of `python -m inference.evaluate --method stepco|pathco --dataset world` (its
`results.jsonl` with traces), per problem:

- answer changes: the initial path's answer against the final one (correct→correct,
  incorrect→correct, correct→incorrect, incorrect→incorrect);
- where round 0 was flagged: the checker's earliest error of the initial path against the first
  step the verifier put under θ (the step the first revision starts from): `at_error`, `before_error`
  (a right step flagged), `after_error` (the error passed), `missed` (an erroneous path accepted),
  `false_alarm` (a right path flagged), `accepted_right`;
  (PathCo revises whole paths: `flagged_erroneous` replaces the three positions);
- revisions that started at the earliest error: how many rewrote that step right (the checker
  finds no error at or before it in the next path), and how many of those problems ended right.

Prints one JSON object per run folder; `--out` also writes them as a list. The world problems are
read back from each row's question with the run's own world config, so only world runs are read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def flag_position(error: int, n_steps: int, flagged: int | None, path_level: bool = False) -> str:
    """Where the first flagged step (0-based, None if none) stands against the earliest error
    (`error` = n_steps when the path has none). `path_level` (PathCo, which always revises from
    step 1): only whether an erroneous path was flagged (`flagged_erroneous`)."""
    if error >= n_steps:
        return "accepted_right" if flagged is None else "false_alarm"
    if flagged is None:
        return "missed"
    if path_level:
        return "flagged_erroneous"
    if flagged == error:
        return "at_error"
    return "before_error" if flagged < error else "after_error"


def _error_index(world_row: dict, steps: list[str]) -> int:
    """The checker's earliest error, len(steps) when the path has none (the checker says -1)."""
    from reasoning.world import earliest_error

    if not steps:
        return 0
    error = earliest_error(world_row, steps)
    return len(steps) if error < 0 else error


def analyse(rows: list[dict], world_rows: dict[str, dict], path_level: bool = False) -> dict:
    from compare.analysis import answer_changes
    from reasoning.world import row_to_problem

    where: Counter = Counter()
    fixed = fixed_and_right = revised_at_error = 0
    kept = []
    for row in rows:
        world = world_rows.get(row["question"])
        rounds = (row.get("trace") or {}).get("rounds") or []
        if world is None or not rounds:
            continue
        kept.append(row)
        first = rounds[0]["steps"]
        error = _error_index(world, first)
        flagged = rounds[1]["revised_index"] - 1 if len(rounds) > 1 and rounds[1].get("revised_index") else None
        position = flag_position(error, len(first), flagged, path_level)
        where[position] += 1
        if position == "at_error":
            revised_at_error += 1
            if _error_index(world, rounds[1]["steps"]) > error:
                fixed += 1
                fixed_and_right += bool(row.get("correct"))
    problems = {row["id"]: row_to_problem({**world_rows[row["question"]], "id": row["id"]}) for row in kept}
    changes = answer_changes(kept, problems)
    counts = {k: changes[k] for k in ("correct_to_correct", "incorrect_to_correct", "correct_to_incorrect",
                                      "incorrect_to_incorrect") if changes[k]}
    return {"problems": len(kept), "skipped": len(rows) - len(kept), "answer_changes": counts,
            "net_gain": changes["net_gain"], "first_flag": dict(where), "revised_at_error": revised_at_error,
            "revision_fixed_the_error": fixed, "fixed_and_final_right": fixed_and_right}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from reasoning.world import generate, world_config_of

    results = []
    for run in map(Path, args.runs):
        results_path, config_path = run / "results.jsonl", run / "run_config.json"
        if not results_path.exists() or not config_path.exists():
            print(f"error: {run}: no results.jsonl / run_config.json (not an inference.evaluate run)", file=sys.stderr)
            return 2
        config = json.loads(config_path.read_text())
        config = config.get("args", config)
        if not str(config.get("dataset", "")).startswith("world"):
            print(f"error: {run}: not a world run (dataset {config.get('dataset')!r})", file=sys.stderr)
            return 2
        split = str(config["dataset"]).partition(":")[2] or "test"
        world = generate(split, int(config.get("n_world") or 500), int(config.get("world_seed") or 0),
                         world_config_of(config.get("policy")))
        rows = [json.loads(line) for line in results_path.read_text().splitlines() if line.strip()]
        path_level = config.get("method") == "pathco"
        result = {"run": str(run), "method": config.get("method"),
                  **analyse(rows, {r["question"]: r for r in world}, path_level)}
        results.append(result)
        print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
