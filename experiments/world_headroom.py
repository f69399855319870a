"""How much room a world policy leaves for RL and revision: greedy accuracy, the error mix of its
greedy errors, pass@k of its own samples, and the same split by the decisions a noisy teacher
misreads (problems with an inverse phrasing, with a stale-count trap, with neither). For credit
assignment: the share of flat groups (all k samples right, or all wrong: a group estimator on the
answer check learns nothing from them), and of those the share whose samples a step reward could
still rank (the world's exact checker finds their first wrong step at different places: a
reference measure, the checker is privileged), and the steps and tokens per sample. For a step
reward and a token budget (`experiments/sample_profile.py`): the own errors of the wrong samples
(`own_errors`; `own_errors_follow_carried`: the same, a step that carries an earlier error under
another quantity's name not counted again), the tokens of right and wrong samples and of the gold solutions (`lengths`,
`gold_tokens`), and for each of `--budgets` what that `max_completion_length` would cut (`budgets`).

    python experiments/world_headroom.py --policy outputs/sft_tiny [--n 500] [--k 8] [--temperature 1.0] \
        [--budgets 100,120]

Prints one JSON object and writes it to POLICY/headroom.json (or --out). The problems are the world
test split of the policy's own world (`world_config.json`), seed 0, as every world figure uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from experiments.sampling_cli import add_sampling_args, sampling_args_error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sampling_args(parser, n=500)
    parser.add_argument("--budgets", type=_budgets, default=[],
                        help="comma-separated token budgets to report cuts for, e.g. 100,120")
    args = parser.parse_args(argv)
    error = sampling_args_error(args, min_k=1)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from experiments.sample_profile import all_wrong_in_smaller_groups, greedy_within
    from reasoning.grading import grade
    from reasoning.prompts import solve_prompt
    from reasoning.steps import split_steps
    from reasoning.world import earliest_error, generate, misreadings_of, row_to_problem, world_config_of
    from rl.greedy_accuracy import greedy_eval

    rows = generate("test", args.n, 0, world_config_of(args.policy))
    problems = [row_to_problem(r) for r in rows]
    tok = AutoTokenizer.from_pretrained(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy).eval()
    gen = HFGenerator(model, tok, batch_size=args.batch_size)
    with torch.no_grad():
        greedy = greedy_eval(gen, problems, args.max_new_tokens)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=args.k,
                                seed=args.seed)
        samples = gen.generate([solve_prompt(p.question) for p in problems], params)
    right = [[grade(c.text, p).correct for c in group] for p, group in zip(problems, samples)]
    kinds = [misreadings_of(r) for r in rows]
    first_wrong = [[earliest_error(p, split_steps(c.text).steps) for c in group] for p, group in zip(problems, samples)]

    def part(idx: list[int]) -> dict:
        if not idx:
            return {"n": 0}
        g = [greedy["rows"][i]["correct"] for i in idx]
        wrong = [i for i in idx if not greedy["rows"][i]["correct"]]
        return {"n": len(idx), "greedy": sum(g) / len(idx),
                f"pass@{args.k}": sum(any(right[i]) for i in idx) / len(idx),
                "sampled": sum(sum(right[i]) for i in idx) / (len(idx) * args.k),
                f"pass@{args.k}_on_greedy_wrong": sum(any(right[i]) for i in wrong) / max(len(wrong), 1),
                "flat_groups": sum(len(set(right[i])) == 1 for i in idx) / len(idx),
                "flat_all_wrong": sum(not any(right[i]) for i in idx) / len(idx),
                "all_wrong_in_groups_of": {str(g): all_wrong_in_smaller_groups([right[i] for i in idx], g)
                                           for g in (2, 4) if g < args.k},
                "flat_ranked_by_steps": (sum(len(set(first_wrong[i])) > 1 for i in idx if len(set(right[i])) == 1)
                                         / max(sum(len(set(right[i])) == 1 for i in idx), 1)),
                "error_mix": dict(Counter(greedy["rows"][i]["error_kind"] or "unknown" for i in wrong).most_common())}

    everything = list(range(len(rows)))
    result = {"policy": args.policy, "temperature": args.temperature, "k": args.k, **part(everything),
              "inverse": part([i for i in everything if "inverse" in kinds[i]]),
              "stale": part([i for i in everything if "stale" in kinds[i]]),
              "neither": part([i for i in everything if not kinds[i]])}
    texts = [c.text for group in samples for c in group]
    result["steps_per_sample"] = sum(len(split_steps(t).steps) for t in texts) / max(len(texts), 1)
    tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    result["tokens_per_sample"] = tokens / max(len(texts), 1)
    mix = result["error_mix"]
    result["misread_share_of_errors"] = (sum(v for k, v in mix.items() if k.startswith("misread"))
                                         / max(sum(mix.values()), 1))
    result.update(_budget_stats(problems, samples, right, args.budgets,
                                lambda t: len(tok(t, add_special_tokens=False)["input_ids"])))
    for budget in args.budgets:
        result["budgets"][str(budget)]["greedy"] = greedy_within(greedy["rows"], budget)
    out = Path(args.out) if args.out else Path(args.policy) / "headroom.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


def _budgets(text: str) -> list[int]:
    """`--budgets 100,120` as [100, 120]: positive token counts."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from err
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"budgets must be >= 1, got {text!r}")
    return values


def _budget_stats(problems: list, samples: list, right: list[list[bool]], budgets: list[int],
                  count_tokens: Callable[[str], int]) -> dict[str, Any]:
    """The own errors of the wrong samples, the lengths, and each budget's cuts (`sample_profile`)."""
    from experiments.sample_profile import Sample, budget_profile, gold_lengths, length_profile, own_error_profile
    from reasoning.world import gold_solution

    groups = [[Sample(c.text, c.completion_tokens, c.finish_reason != "length", ok) for c, ok in zip(group, oks)]
              for group, oks in zip(samples, right)]
    return {"own_errors": own_error_profile(problems, groups),
            "own_errors_follow_carried": own_error_profile(problems, groups, follow_carried=True),
            "lengths": length_profile(groups),
            "gold_tokens": gold_lengths(problems, gold_solution, count_tokens),
            "budgets": {str(b): budget_profile(groups, b) for b in budgets}}


if __name__ == "__main__":
    sys.exit(main())
