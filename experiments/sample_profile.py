"""What a world policy's own samples leave a step reward and a token budget: the own errors of its
wrong samples, the token lengths of its right and wrong samples and of the gold solutions, and what
a token budget (`max_completion_length` in RL) cuts.

- `own_error_profile`: of the wrong samples, the share with 0, 1, 2 and 3 or more *own* errors
  (wrong steps that are not `propagated`, as `experiments/step_errors.py` counts them) and own
  errors per wrong sample by kind. A step reward can locate an error where a wrong sample has one or
  two of its own; with many, every step is to blame.
- `length_profile`: tokens per sample (EOS counted when the sample ended), right and wrong apart:
  median, 90th and 95th percentile, maximum; samples that hit the sampling cap count as unfinished.
- `gold_lengths`: the same for the gold solutions (their tokens and the EOS): what a right solution
  needs.
- `budget_profile`: under a budget of B tokens a sample is cut unless it ended within B tokens, and
  a cut sample is wrong (it never states its answer): the share cut, the share of right samples cut,
  and accuracy, pass@k and the flat and all-wrong group shares that remain; `greedy_within`: greedy
  accuracy under the budget.
- `all_wrong_in_smaller_groups`: the all-wrong share groups of fewer samples would have, from the
  same samples.

`experiments/world_headroom.py` reports them (its `own_errors`, `own_errors_follow_carried`, `lengths`,
`gold_tokens` and `budgets` keys).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.step_errors import BUCKETS, own_errors


@dataclass(frozen=True)
class Sample:
    """One sampled response: its text, completion tokens (EOS included when it ended), whether it
    ended before the sampling cap, and whether the answer check found it right."""

    text: str
    tokens: int
    finished: bool
    right: bool


def quantile(values: Sequence[int], q: float) -> int:
    """The nearest-rank q-quantile (0 < q <= 1) of integer values: the smallest value with at least
    a share q of the values at or below it."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def _summary(values: Sequence[int]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": sum(values) / len(values),
        "median": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p95": quantile(values, 0.95),
        "max": max(values),
    }


def own_error_profile(problems: Sequence[Any], groups: Sequence[Sequence[Sample]],
                      follow_carried: bool = False) -> dict[str, Any]:
    """Own errors of the wrong samples (`groups[i]` are the samples of `problems[i]`);
    `follow_carried` as in `experiments.step_errors.own_errors`."""
    if len(problems) != len(groups):
        raise ValueError(f"{len(problems)} problems but {len(groups)} groups of samples")
    counts: list[int] = []
    kinds: Counter[str] = Counter()
    lone: Counter[str] = Counter()
    for problem, group in zip(problems, groups):
        for s in group:
            if s.right:
                continue
            errs, _ = own_errors(problem, s.text, follow_carried)
            counts.append(len(errs))
            kinds.update(errs)
            if len(errs) == 1:
                lone[errs[0]] += 1
    n = len(counts)
    if not n:
        return {"n_wrong": 0}
    buckets = Counter(BUCKETS[min(c, 3)] for c in counts)
    return {
        "n_wrong": n,
        "errors_per_wrong": sum(counts) / n,
        "share": {b: buckets[b] / n for b in BUCKETS},
        "one_or_two": (buckets["1"] + buckets["2"]) / n,
        "by_kind": {k: v / n for k, v in kinds.most_common()},
        "lone_error_kind": dict(lone.most_common()),
    }


def length_profile(groups: Sequence[Sequence[Sample]]) -> dict[str, Any]:
    """Tokens of the finished samples, right and wrong apart, and the count that hit the cap."""
    samples = [s for g in groups for s in g]
    done = [s for s in samples if s.finished]
    return {
        "right": _summary([s.tokens for s in done if s.right]),
        "wrong": _summary([s.tokens for s in done if not s.right]),
        "unfinished": sum(not s.finished for s in samples),
        "n": len(samples),
    }


def gold_lengths(
    problems: Sequence[Any], gold_text: Callable[[Any], str], count_tokens: Callable[[str], int]
) -> dict[str, Any]:
    """Tokens of each problem's gold solution, plus one for the EOS that ends it."""
    return _summary([count_tokens(gold_text(p)) + 1 for p in problems])


def budget_profile(groups: Sequence[Sequence[Sample]], budget: int) -> dict[str, Any]:
    """What a budget of `budget` tokens leaves: a sample that did not end within it is cut, and wrong."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not groups or any(not g for g in groups):
        raise ValueError("budget_profile needs at least one sample in every group")
    within = [[s.finished and s.tokens <= budget for s in g] for g in groups]
    right = [[s.right and w for s, w in zip(g, ws)] for g, ws in zip(groups, within)]
    n_samples = sum(len(g) for g in groups)
    n_right = sum(s.right for g in groups for s in g)
    return {
        "budget": budget,
        "cut": sum(not w for ws in within for w in ws) / n_samples,
        "right_cut": (n_right - sum(map(sum, right))) / n_right if n_right else None,
        "sampled": sum(map(sum, right)) / n_samples,
        "pass@k": sum(any(r) for r in right) / len(groups),
        "flat_groups": sum(len(set(r)) == 1 for r in right) / len(groups),
        "flat_all_wrong": sum(not any(r) for r in right) / len(groups),
    }


def all_wrong_in_smaller_groups(right: Sequence[Sequence[bool]], size: int) -> float:
    """The share of groups of `size` samples that would be all wrong, estimated without bias from
    larger groups of one problem's samples (`right[i]`: whether each sample of problem i is right):
    the mean over problems of C(wrong_i, size) / C(k_i, size), the chance that `size` samples drawn
    without replacement from problem i's k_i are all wrong."""
    if not right or any(len(r) < size for r in right) or size < 1:
        raise ValueError(f"all_wrong_in_smaller_groups needs groups of at least {max(size, 1)} samples")
    return sum(math.comb(len(r) - sum(r), size) / math.comb(len(r), size) for r in right) / len(right)


def greedy_within(rows: Sequence[dict[str, Any]], budget: int) -> float:
    """Greedy accuracy under a budget: right rows (`rl.greedy_accuracy.greedy_rows`) that ended within it."""
    if not rows:
        raise ValueError("greedy_within needs greedy rows")
    kept = [r["correct"] and r["finish_reason"] != "length" and r["completion_tokens"] <= budget for r in rows]
    return sum(kept) / len(rows)
