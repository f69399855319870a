"""Does a verifier tell the right reading of a relation from the noisy teacher's misreading?

For every world dev problem whose solution has a decision the teacher misreads (an inverse
phrasing, a stale count after an event), the gold solution and the teacher's misread solution
share their steps up to the first step where the readings differ. This script scores both paths
with the verifier and reports, per misreading kind:

- `first_diff_gold_higher`: the share of pairs where the verifier scores the gold step higher than
  the misread step at that first differing step (ties count as not higher): what a step reward
  must get right for RL to move the policy off the misreading;
- `min_gold_higher`: the same for the weakest step score of each whole path (what `--reward_shaping
  min` and `--outcome_aggregation min` reward);
- the mean scores of both steps.

    python experiments/verifier_separation.py --verifier outputs/psv_noisy [--policy outputs/sft_noisy] [--n 300]

`--verifier` takes any spec `reward_models.load.load_verifier` reads (a PSV folder, `step-confidence`
with `--policy`, `exact`, a combination). The problems are the world dev split (seed 0) of the
policy's world, so the test split stays unseen. Prints one JSON object; `--out` also writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pairs_of(rows: list[dict]) -> list[dict]:
    """(gold path, misread path, index of the first differing step, kind) for each problem and
    misreading kind whose teacher solution differs from gold."""
    from reasoning.world import MISREADINGS, teacher_solution

    out = []
    for row in rows:
        gold = list(row["steps"])
        for kind in MISREADINGS:
            bad = teacher_solution(row, (kind,))
            if bad is None:
                continue
            first = next((i for i, (g, b) in enumerate(zip(gold, bad)) if g != b), None)
            if first is None:  # one path is a prefix of the other: nothing to compare at one step
                continue
            out.append({"row": row, "kind": kind, "gold": gold, "bad": bad, "first": first})
    return out


def separation(pairs: list[dict], gold_scores: list[list[float]], bad_scores: list[list[float]]) -> dict:
    """Shares of pairs where the gold path scores higher, at the first differing step and at the
    path minimum, with mean scores; `None` shares where there are no pairs."""
    n = len(pairs)
    first_higher = [g[p["first"]] > b[p["first"]] for p, g, b in zip(pairs, gold_scores, bad_scores)]
    min_higher = [min(g) > min(b) for g, b in zip(gold_scores, bad_scores)]
    return {
        "pairs": n,
        "first_diff_gold_higher": sum(first_higher) / n if n else None,
        "min_gold_higher": sum(min_higher) / n if n else None,
        "mean_gold_step": sum(g[p["first"]] for p, g in zip(pairs, gold_scores)) / n if n else None,
        "mean_misread_step": sum(b[p["first"]] for p, b in zip(pairs, bad_scores)) / n if n else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--policy", default=None, help="whose world to read, and for step-confidence")
    parser.add_argument("--n", type=int, default=300, help="dev problems to draw (not all have a misreading)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.n < 1:
        print("error: --n must be >= 1", file=sys.stderr)
        return 2
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    import torch

    from reasoning.world import generate, world_config_of
    from reward_models.load import check_spec, load_verifier

    try:
        check_spec(args.verifier, args.policy)
    except ValueError as err:
        print(f"error: --verifier {args.verifier}: {err}", file=sys.stderr)
        return 2
    rows = generate("dev", args.n, 0, world_config_of(args.policy))
    pairs = pairs_of(rows)
    if not pairs:
        print("error: no dev problem has a misreading to compare; raise --n", file=sys.stderr)
        return 2
    verifier = load_verifier(args.verifier, args.policy, world_rows=rows, batch_size=args.batch_size)
    questions = [p["row"]["question"] for p in pairs]
    with torch.no_grad():
        gold_scores = verifier.score(questions, [p["gold"] for p in pairs])
        bad_scores = verifier.score(questions, [p["bad"] for p in pairs])
    result = {"verifier": args.verifier, "policy": args.policy, "dev_problems": args.n,
              **separation(pairs, gold_scores, bad_scores), "by_kind": {}}
    for kind in sorted({p["kind"] for p in pairs}):
        idx = [i for i, p in enumerate(pairs) if p["kind"] == kind]
        result["by_kind"][kind] = separation([pairs[i] for i in idx], [gold_scores[i] for i in idx],
                                             [bad_scores[i] for i in idx])
    result["verifier_tokens"] = getattr(verifier, "tokens_used", None)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
