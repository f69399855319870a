"""Bootstrap intervals for accuracies and for paired differences of accuracies.

`accuracy_interval`: one accuracy (k of n right). `paired_bootstrap_diff`: a change of accuracy;
`paired_over_seeds`: the same over runs of several seeds on shared problems. `best_of_k`: the chance
that one of k tries is right, from sampled tries (a Best-of-K prover's value, pass@k).
Comparisons in this toolkit are paired: every policy or method answers the same problems, so the
interval of a difference resamples problems once and takes both outcomes of each drawn problem.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from math import comb


def _check(values: Sequence[float], name: str) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{name}: no values to bootstrap")
    return out


def _percentiles(samples: list[float], confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    samples.sort()
    alpha = (1 - confidence) / 2
    lo = samples[int(alpha * (len(samples) - 1))]
    hi = samples[int(round((1 - alpha) * (len(samples) - 1)))]
    return lo, hi


def accuracy_interval(correct: int, n: int, resamples: int = 1000, seed: int = 0) -> list[float] | None:
    """95% percentile bootstrap interval of an accuracy (`correct` of `n` graded rows resampled with
    replacement), rounded to 6 places; None for no rows.

    The number correct in a resample is Binomial(n, correct / n), so it is drawn directly (numpy),
    and the interval is numpy's interpolated 2.5% and 97.5% quantiles. This is the interval of every
    `accuracy_ci95` in `inference.evaluate`'s summaries (and the comparison's tables)."""
    if n == 0:
        return None
    import numpy as np

    rng = np.random.default_rng(seed)
    means = rng.binomial(n, correct / n, size=resamples) / n
    lo, hi = np.quantile(means, [0.025, 0.975])
    return [round(float(lo), 6), round(float(hi), 6)]


def paired_bootstrap_diff(before: Sequence[float], after: Sequence[float], resamples: int = 2000,
                          confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Mean of `after - before` over paired items and its percentile bootstrap interval."""
    a, b = _check(before, "before"), _check(after, "after")
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap needs the same items: {len(a)} before, {len(b)} after")
    diffs = [y - x for x, y in zip(a, b)]
    rng = random.Random(seed)
    n = len(diffs)
    means = [sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples)]
    lo, hi = _percentiles(means, confidence)
    return {"diff": sum(diffs) / n, "ci_low": lo, "ci_high": hi, "n": n}


def paired_over_seeds(base: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]],
                      ids: Sequence[str], seed: int = 0) -> dict[str, float]:
    """other − base over `ids`, each run a mapping of problem id to correctness, run k of each side
    from seed k: every problem counts once, with its mean over the seeds, and the interval resamples
    problems (the seeds share their problems, so (seed, problem) pairs are not independent)."""
    if len(base) != len(other) or not base:
        raise ValueError(f"paired_over_seeds needs one run per seed on each side: {len(base)} against {len(other)}")
    k = len(base)
    return paired_bootstrap_diff([sum(b[i] for b in base) / k for i in ids],
                                 [sum(o[i] for o in other) / k for i in ids], seed=seed)


def best_of_k(right: int, trials: int, k: int) -> float:
    """The chance that at least one of `k` continuations is right, from `right` of `trials` sampled
    continuations: the unbiased pass@k estimate where trials >= k, the plug-in 1 − (1 − q)^k below."""
    if trials < 1 or k < 1 or not 0 <= right <= trials:
        raise ValueError(f"best_of_k needs 0 <= right <= trials, trials >= 1 and k >= 1; got {right}, {trials}, {k}")
    if k == 1:
        return right / trials
    if trials >= k:
        return 1.0 - comb(trials - right, k) / comb(trials, k)
    return 1.0 - (1.0 - right / trials) ** k
