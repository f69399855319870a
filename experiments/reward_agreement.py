"""How closely a verifier's path score ranks the policy's own samples the way the answer check does.

Group RL (`--advantage_estimator group`, TRL's GRPO) learns from how a reward orders the samples
of one prompt against each other, not from its scale. This script draws K samples at T=1 for N
world dev problems from the policy (the prompts RL would see, the test split left unseen), grades
each by its final answer, scores every sample with each verifier, and reports per verifier and per
path aggregation (`min`, `mean`, `last` of the step scores):

- `pair_accuracy`: over every pair of samples of one prompt where one is right and one is wrong,
  the share where the right one scores higher (ties count half): the within-group AUC. The gold
  reward scores 1.0; a reward that ignores correctness 0.5;
- `pairs`, `mixed_groups`: how many such pairs and prompts there are (prompts whose samples all
  agree give GRPO nothing);
- `advantage_corr`: the correlation, over samples of mixed groups, between the group-normalised
  verifier score and the group-normalised gold reward: how much of the gold advantage it carries.

With two or more verifiers named, `--ratio A,B` adds `log(A) - log(B)` per step (for example a
verifier LM's step likelihood over the policy's own) as one more candidate.

    python experiments/reward_agreement.py --policy outputs/sft_noisy \\
        --verifier step-likelihood:outputs/sft_clean_v --verifier outputs/psv_mc_a [--n 200] [--k 8]

Prints one JSON object; `--out` also writes it. Samples are drawn once (seeded) and shared by all
verifiers, so the figures compare like with like.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AGGS = ("min", "mean", "last")


def pair_accuracy(groups: list[tuple[list[float], list[bool]]]) -> tuple[float | None, int]:
    """Within-group AUC of scores against right/wrong, ties counted half, and the pair count."""
    wins = 0.0
    pairs = 0
    for scores, right in groups:
        good = [s for s, r in zip(scores, right) if r]
        bad = [s for s, r in zip(scores, right) if not r]
        for g in good:
            for b in bad:
                pairs += 1
                wins += 1.0 if g > b else 0.5 if g == b else 0.0
    return (wins / pairs if pairs else None), pairs


def _normalised(xs: list[float]) -> list[float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    return [(x - m) / sd if sd > 0 else 0.0 for x in xs]


def advantage_corr(groups: list[tuple[list[float], list[bool]]]) -> float | None:
    """Pearson correlation of group-normalised scores with group-normalised gold, mixed groups only."""
    a: list[float] = []
    b: list[float] = []
    for scores, right in groups:
        if all(right) or not any(right):
            continue
        a += _normalised(scores)
        b += _normalised([float(r) for r in right])
    if len(a) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else None


def path_score(steps: list[float], how: str) -> float:
    if how == "min":
        return min(steps)
    if how == "mean":
        return sum(steps) / len(steps)
    return steps[-1]


def report(step_scores: list[list[float] | None], right: list[bool], k: int) -> dict:
    """The figures above for one verifier's per-step scores (None where a sample had no step)."""
    out = {}
    for how in AGGS:
        groups = []
        for start in range(0, len(right), k):
            scores = [path_score(s, how) if s else -math.inf for s in step_scores[start:start + k]]
            groups.append((scores, right[start:start + k]))
        acc, pairs = pair_accuracy(groups)
        out[how] = {"pair_accuracy": acc, "advantage_corr": advantage_corr(groups)}
        out["pairs"] = pairs
    return out


def main(argv: list[str] | None = None) -> int:
    from experiments.sampling_cli import add_sampling_args, sampling_args_error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sampling_args(parser, n=200)
    parser.add_argument("--verifier", action="append", required=True,
                        help="a verifier spec (repeat for several)")
    parser.add_argument("--ratio", action="append", default=[],
                        help="A,B: two of the --verifier specs; adds log(A) - log(B) per step")
    args = parser.parse_args(argv)
    error = sampling_args_error(args, min_k=2)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    ratios = []
    for r in args.ratio:
        parts = r.split(",")
        if len(parts) != 2 or any(p not in args.verifier for p in parts):
            print(f"error: --ratio {r!r}: give two of the --verifier specs, comma-separated", file=sys.stderr)
            return 2
        ratios.append(tuple(parts))
    from reward_models.load import check_spec

    for spec in args.verifier:
        try:
            check_spec(spec, args.policy)
        except ValueError as e:
            print(f"error: --verifier {spec}: {e}", file=sys.stderr)
            return 2
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    import torch

    from backends.base import SamplingParams
    from backends.factory import make_generator
    from reasoning.grading import grade
    from reasoning.prompts import solve_prompt
    from reasoning.steps import split_steps
    from reasoning.world import generate, row_to_problem, world_config_of
    from reward_models.load import load_verifier

    # the world dev split: the prompts RL would see are train ones; the test split stays unseen
    rows = generate("dev", args.n, 0, world_config_of(args.policy))
    problems = [row_to_problem(r) for r in rows]
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=args.k,
                              seed=args.seed)
    with torch.no_grad():
        samples = make_generator("hf", args.policy, batch_size=args.batch_size).generate(
            [solve_prompt(p.question) for p in problems], sampling)
    questions, paths, right, index = [], [], [], []
    for p, group in zip(problems, samples):
        for c in group:
            right.append(grade(c.text, p).correct)
            steps = split_steps(c.text).steps
            if steps:
                index.append(len(right) - 1)
                questions.append(p.question)
                paths.append(steps)
    result = {"policy": args.policy, "n": args.n, "k": args.k, "temperature": args.temperature,
              "sampled_accuracy": sum(right) / len(right), "without_steps": len(right) - len(paths),
              "gold": report([[1.0] if r else [0.0] for r in right], right, args.k)["min"],
              "verifiers": {}}
    scored = {}
    for spec in args.verifier:
        verifier = load_verifier(spec, args.policy, world_rows=rows)
        with torch.no_grad():
            got = verifier.score(questions, paths)
        per_sample: list[list[float] | None] = [None] * len(right)
        for i, s in zip(index, got):
            per_sample[i] = s
        scored[spec] = per_sample
        result["verifiers"][spec] = report(per_sample, right, args.k)
    for a, b in ratios:
        eps = 1e-12
        diff = [None if x is None else [math.log(max(u, eps)) - math.log(max(v, eps)) for u, v in zip(x, y)]
                for x, y in zip(scored[a], scored[b])]
        result["verifiers"][f"log({a}) - log({b})"] = report(diff, right, args.k)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
