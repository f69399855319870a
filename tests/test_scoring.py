"""Path scoring with one failure policy (reward_models/scoring.py), as every caller uses it."""

from __future__ import annotations

import pytest

from reward_models.scoring import ScoredPaths, score_paths, unscorable_reason
from reward_models.verifier import VerifierInputError


class LengthLimited:
    """Scores each step 0.5; refuses a whole batch when any path has more than `limit` steps."""

    def __init__(self, limit: int = 2):
        self.limit, self.calls, self.tokens_used = limit, [], 0

    def score(self, questions, paths):
        self.calls.append(len(paths))
        for i, p in enumerate(paths):
            if len(p) > self.limit:
                raise VerifierInputError(f"row {i}: longer than the context ({self.limit} steps)")
        return [[0.5] * len(p) for p in paths]


def test_an_unscorable_path_is_none_and_counted_and_the_others_keep_their_scores():
    verifier = LengthLimited(limit=2)
    paths = [["a"], [], ["a", "b", "c"], ["a", " "], ["a", "b"]]
    got = score_paths(verifier, ["q"] * len(paths), paths)
    assert isinstance(got, ScoredPaths)
    assert got.scores == [[0.5], None, None, None, [0.5, 0.5]]
    assert got.unscorable == 3 and sorted(got.errors) == [1, 2, 3]
    assert got.reasons() == {"no_steps": 1, "too_long": 1, "empty_step": 1}
    # the invalid paths are never sent; the refused batch is scored path by path
    assert verifier.calls == [3, 1, 1, 1]


def test_scorable_paths_go_in_one_call_or_in_batches():
    verifier = LengthLimited(limit=5)
    paths = [["a"], ["a", "b"], ["c"]]
    assert score_paths(verifier, ["q"] * 3, paths).scores == [[0.5], [0.5, 0.5], [0.5]]
    assert verifier.calls == [3]
    verifier.calls.clear()
    got = score_paths(verifier, ["q"] * 3, paths, batch_size=2)
    assert got.unscorable == 0 and verifier.calls == [2, 1]


def test_an_error_that_is_not_the_paths_is_raised():
    class Broken:
        def score(self, questions, paths):
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        score_paths(Broken(), ["q"], [["a"]])


def test_a_question_the_exact_checker_does_not_know_is_unscorable():
    from reasoning.world import generate
    from reward_models.exact import ExactVerifier

    rows = generate("train", 1, 0)
    got = score_paths(ExactVerifier.from_rows(rows), [rows[0]["question"], "an unknown question"],
                      [["x = 1"], ["x = 1"]])
    assert got.scores[0] is not None and got.scores[1] is None
    assert got.reasons() == {"unknown_question": 1}
    assert unscorable_reason("something else") == "error"


def test_every_caller_reports_the_unscorable_count(tmp_path):
    """PPO's verifier rewards, the inference tracker and evaluation's score_items all go through it."""
    from inference.methods.base import Tracker
    from reward_models.verifier_metrics import PathItem, score_items
    from rl.rewards import VerifierOutcomeReward, VerifierStepReward

    paths = [["a"], ["a", "b", "c"], []]
    for reward in (VerifierStepReward(LengthLimited()), VerifierOutcomeReward(LengthLimited())):
        out = reward(prompts=[""] * 3, completions=[""] * 3, question=["q"] * 3, steps=paths)
        assert out[1] is None and out[2] is None and out[0] is not None
        assert out.unscorable == 2 and out.scores[1] is None and out.scores[0] is not None

    tracker = Tracker(generator=None, verifier=LengthLimited(), n_problems=3)
    tokens: list[int] = []
    assert tracker.score_paths([0, 1, 2], ["q"] * 3, paths, tokens=tokens) == [[0.5], None, None]
    assert tokens == [0, 0, 0]
    assert tracker.usage[0].verifier_calls == 1 and tracker.usage[1].verifier_calls == 0

    items = [PathItem(id=str(i), problem_id="p", question="q", steps=p, gold=-1)
             for i, p in enumerate(paths)]
    scores, reasons = score_items(LengthLimited(), items, batch_size=2)
    assert scores == [[0.5], None, None]
    assert [r and r[0] for r in reasons] == [None, "too_long", "no_steps"]
