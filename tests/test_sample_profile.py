"""experiments.sample_profile: own errors of wrong samples, token lengths and budget cuts, on hand-made samples."""

import argparse
import math
import random
import re

import pytest

from backends.base import Completion
from experiments import sample_profile as sp
from experiments.world_headroom import _budget_stats, _budgets
from reasoning.world import WorldConfig, corrupt_steps, generate, gold_solution

CFG = WorldConfig(min_steps=3, max_steps=3)


def _slip(step: str) -> str:
    return re.sub(r"= (\d+)", lambda m: f"= {int(m.group(1)) + 1}", step, count=1)


def test_quantile_is_nearest_rank():
    values = list(range(10, 0, -1))
    assert [sp.quantile(values, q) for q in (0.1, 0.5, 0.9, 0.95, 1.0)] == [1, 5, 9, 10, 10]
    assert sp.quantile([7], 0.5) == 7
    with pytest.raises(ValueError):
        sp.quantile([], 0.5)
    with pytest.raises(ValueError):
        sp.quantile([1, 2], 0.0)


def test_own_errors_of_wrong_samples_only():
    problems = generate("test", 2, 0, CFG)
    gold = [gold_solution(p) for p in problems]
    steps = gold[0].split("\n")
    two_slips = "\n".join([_slip(steps[0]), steps[1], _slip(steps[2]), steps[3]])  # 3 own errors
    carried, _, _ = corrupt_steps(problems[1], random.Random(0), at=0)  # 1 own error, the rest carried
    groups = [
        [sp.Sample(gold[0], 30, True, True), sp.Sample(two_slips, 30, True, False)],
        [sp.Sample("\n".join(carried), 30, True, False), sp.Sample(gold[1], 30, True, False)],
    ]
    out = sp.own_error_profile(problems, groups)
    assert out["n_wrong"] == 3  # the right sample is not counted, even with 0 own errors
    assert out["share"] == {"0": 1 / 3, "1": 1 / 3, "2": 0.0, "3+": 1 / 3}
    assert out["one_or_two"] == 1 / 3 and out["errors_per_wrong"] == 4 / 3
    assert out["by_kind"] == {"slip": 2 / 3, "wrong_operand": 2 / 3}
    assert out["lone_error_kind"] == {"wrong_operand": 1}
    assert sp.own_error_profile(problems, [[groups[0][0]], []]) == {"n_wrong": 0}
    with pytest.raises(ValueError):
        sp.own_error_profile(problems, groups[:1])


def _groups():
    return [
        [sp.Sample("a", 10, True, True), sp.Sample("b", 20, True, False)],
        [sp.Sample("c", 30, True, True), sp.Sample("d", 40, False, False)],
    ]


def test_lengths_split_right_wrong_and_unfinished():
    out = sp.length_profile(_groups())
    assert out["right"] == {"n": 2, "mean": 20.0, "median": 10, "p90": 30, "p95": 30, "max": 30}
    assert out["wrong"] == {"n": 1, "mean": 20.0, "median": 20, "p90": 20, "p95": 20, "max": 20}
    assert out["unfinished"] == 1 and out["n"] == 4
    gold = sp.gold_lengths(["one two", "one two three four"], lambda p: p, lambda t: len(t.split()))
    assert gold["max"] == 5 and gold["median"] == 3  # each plus its EOS


def test_budget_cuts_count_as_wrong():
    tight = sp.budget_profile(_groups(), 25)
    assert tight == {
        "budget": 25,
        "cut": 0.5,
        "right_cut": 0.5,
        "sampled": 0.25,
        "pass@k": 0.5,
        "flat_groups": 0.5,
        "flat_all_wrong": 0.5,
    }
    loose = sp.budget_profile(_groups(), 100)  # the unfinished sample stays cut at any budget
    assert loose["cut"] == 0.25 and loose["right_cut"] == 0.0 and loose["pass@k"] == 1.0
    assert loose["flat_all_wrong"] == 0.0 and loose["flat_groups"] == 0.0  # one right in each
    assert sp.budget_profile([[sp.Sample("x", 5, True, False)]], 10)["right_cut"] is None
    with pytest.raises(ValueError):
        sp.budget_profile(_groups(), 0)
    with pytest.raises(ValueError):
        sp.budget_profile([[]], 10)


def test_the_all_wrong_share_of_smaller_groups_is_the_chance_a_draw_of_them_is_all_wrong():
    import itertools

    right = [[True, False, False, False], [False] * 4, [True] * 4, [True, True, False, False]]
    for size in (1, 2, 3, 4):
        drawn = [sum(not any(c) for c in itertools.combinations(r, size)) / math.comb(4, size) for r in right]
        assert sp.all_wrong_in_smaller_groups(right, size) == pytest.approx(sum(drawn) / len(right))
    assert sp.all_wrong_in_smaller_groups(right, 4) == 0.25  # the groups as they are: one of four all wrong
    assert sp.all_wrong_in_smaller_groups(right, 2) == pytest.approx((0.5 + 1 + 0 + 1 / 6) / 4)
    for size in (0, 5):
        with pytest.raises(ValueError):
            sp.all_wrong_in_smaller_groups(right, size)


def test_world_headroom_budget_stats():
    problems = generate("test", 2, 0, CFG)
    gold = [gold_solution(p) for p in problems]
    samples = [
        [Completion(gold[0], 9, 31, "stop"), Completion("x", 9, 64, "length")],
        [Completion(gold[1], 9, 29, "stop"), Completion(gold[1], 9, 29, "stop")],
    ]
    out = _budget_stats(problems, samples, [[True, False], [True, True]], [30, 64], lambda t: len(t.split()))
    assert out["lengths"]["right"]["max"] == 31 and out["lengths"]["unfinished"] == 1
    assert out["budgets"]["30"]["right_cut"] == 1 / 3 and out["budgets"]["64"]["right_cut"] == 0.0
    assert out["own_errors"]["n_wrong"] == 1 and out["own_errors_follow_carried"]["n_wrong"] == 1
    assert out["gold_tokens"]["n"] == 2
    assert _budgets("100, 120") == [100, 120]
    for bad in ("0", "a,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            _budgets(bad)


def test_greedy_within_a_budget():
    rows = [
        {"correct": True, "finish_reason": "stop", "completion_tokens": 40},
        {"correct": True, "finish_reason": "stop", "completion_tokens": 60},
        {"correct": False, "finish_reason": "stop", "completion_tokens": 20},
        {"correct": True, "finish_reason": "length", "completion_tokens": 50},
    ]
    assert sp.greedy_within(rows, 50) == 0.25 and sp.greedy_within(rows, 60) == 0.5
    with pytest.raises(ValueError):
        sp.greedy_within([], 50)
