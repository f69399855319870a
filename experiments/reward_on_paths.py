"""How a frozen verifier scores a run's greedy paths before and after RL: did its reward rise while
the answers got worse? (A reward that was hacked did; one that was learned did not need to.)

    python -m experiments.reward_on_paths outputs/long/ipmstepmin_s{0,1,2} --verifier implicit:outputs/ipm_long/prm_2k

For each run folder (`eval_before_rows.jsonl` and `eval_after_rows.jsonl` of `rl/ppo_step.py` or
`rl/baselines/grpo_peer.py`), and each of the two, the verifier (any spec of `reward_models.load`, read as it
is on disk: a PRM updated online during the run is scored as it was before the run) scores every
greedy path step by step, and the script prints:

- `accuracy`: the share of paths whose answer is right (the rows' own `correct`);
- `min score`, `mean score`: the path's weakest step score and its mean step score (the rewards
  of `--reward_shaping min` and of `--outcome_aggregation mean`), averaged over paths;
- the mean min score of the right paths and of the wrong ones, and `steps`: steps per path.

The world test problems are rebuilt from the run's `run_config.json` as in
`experiments/name_use.py`. Writes nothing; `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.name_use import run_problems  # noqa: E402
from reasoning.jsonl import read_jsonl  # noqa: E402
from reasoning.steps import split_steps  # noqa: E402


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def score_rows(verifier, rows: Sequence[dict[str, Any]], questions: dict[str, str],
               batch_size: int = 64) -> dict[str, Any]:
    """The figures above for greedy `rows` ({id, completion, correct}); `questions` by row id. A path
    with no steps is counted (`empty_paths`) and left out of the scores."""
    scored: list[tuple[bool, list[float]]] = []
    empty = 0
    todo: list[tuple[str, list[str], bool]] = []
    for row in rows:
        if row["id"] not in questions:
            raise KeyError(f"row id {row['id']!r} is not one of the rebuilt world problems "
                           "(another world seed, n_eval or policy world?)")
        steps = split_steps(row.get("completion") or "").steps
        if not steps:
            empty += 1
            continue
        todo.append((questions[row["id"]], steps, bool(row.get("correct"))))
    for start in range(0, len(todo), batch_size):
        part = todo[start:start + batch_size]
        got = verifier.score([q for q, _, _ in part], [s for _, s, _ in part])
        scored.extend((ok, list(map(float, s))) for (_, _, ok), s in zip(part, got))
    mins = [min(s) for _, s in scored]
    return {
        "paths": len(rows), "empty_paths": empty,
        "accuracy": sum(bool(r.get("correct")) for r in rows) / len(rows) if rows else None,
        "min_score": _mean(mins),
        "mean_score": _mean([sum(s) / len(s) for _, s in scored]),
        "min_score_right": _mean([min(s) for ok, s in scored if ok]),
        "min_score_wrong": _mean([min(s) for ok, s in scored if not ok]),
        "steps": _mean([len(s) for _, s in scored]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders with eval_before_rows.jsonl and eval_after_rows.jsonl")
    parser.add_argument("--verifier", required=True, help="a reward_models.load spec, e.g. implicit:PATH")
    parser.add_argument("--policy", help="the starting policy, for runs without run_config.json")
    parser.add_argument("--world_seed", type=int)
    parser.add_argument("--n_eval", type=int)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    try:  # every input is read and checked before the verifier is loaded
        jobs: list[tuple[str, list[dict], dict[str, str]]] = []
        for name in args.runs:
            run = Path(name)
            if not run.is_dir():
                raise ValueError(f"{run} is not a run folder")
            problems = run_problems(run, args.policy, args.world_seed, args.n_eval)
            questions = {pid: p["question"] for pid, p in problems.items()}
            for when in ("before", "after"):
                path = run / f"eval_{when}_rows.jsonl"
                if not path.exists():
                    raise ValueError(f"{path} does not exist")
                rows, lines = read_jsonl(path)  # DatasetError (a ValueError) names the file and line
                for row, line in zip(rows, lines):
                    if "id" not in row:
                        raise ValueError(f"{path}:{line}: no 'id' field")
                jobs.append((f"{run.name} {when}", rows, questions))
        from reward_models.load import load_verifier

        verifier = load_verifier(args.verifier)
        result = {key: score_rows(verifier, rows, questions) for key, rows, questions in jobs}
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    fmt = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    print("| run | paths | accuracy | min score | mean score | min score, right paths | min score, wrong paths "
          "| steps |")
    print("|---|---|---|---|---|---|---|---|")
    for key, r in result.items():
        print(f"| {key} | {r['paths']} | {fmt(r['accuracy'])} | {fmt(r['min_score'])} | {fmt(r['mean_score'])} | "
              f"{fmt(r['min_score_right'])} | {fmt(r['min_score_wrong'])} | {fmt(r['steps'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
