"""Bootstrap intervals (reasoning/stats.py)."""

from reasoning.stats import accuracy_interval, paired_bootstrap_diff


def test_accuracy_interval():
    assert accuracy_interval(0, 0) is None
    assert accuracy_interval(10, 10) == [1.0, 1.0]
    lo, hi = accuracy_interval(50, 100)
    assert 0.38 < lo < 0.45 < 0.55 < hi < 0.62
    assert accuracy_interval(50, 100) == [lo, hi]  # deterministic


def test_paired_difference_pairs_items():
    before, after = [0, 0, 1, 1] * 25, [1, 0, 1, 1] * 25
    d = paired_bootstrap_diff(before, after, resamples=500)
    assert d["diff"] == 0.25 and d["n"] == 100 and d["ci_low"] < 0.25 < d["ci_high"]
    same = paired_bootstrap_diff(after, after, resamples=500)
    assert same["diff"] == same["ci_low"] == same["ci_high"] == 0.0
