"""The shared verifier interface, the exact verifier and the training-free confidence verifier."""

import math

import pytest
import torch

from reasoning.tokenizer import train_tokenizer
from reasoning.world import corrupt_steps, generate
from reward_models.confidence import ConfidenceVerifier, result_span
from reward_models.exact import ExactVerifier
from reward_models.verifier import (
    Verifier,
    VerifierInputError,
    aggregate,
    layout,
    token_positions,
    validate_paths,
)
from rl.models import build_tiny_causal_lm


def test_layout_marks_each_step_end():
    lay = layout("Q?", ["a b", "c"])
    assert [lay.text[e - 6 : e + 1] for e in lay.step_end_chars] == ["</Step>", "</Step>"]
    assert lay.text.endswith("</Step>\n") and "<Step> a b</Step>\n<Step> c</Step>" in lay.text


@pytest.mark.parametrize("questions, paths, match", [
    (["q"], [[]], "zero steps"),
    (["q"], [["a", "  "]], "step 1 is empty"),
    (["q", "r"], [["a"]], "2 questions but 1 paths"),
    (["q"], ["abc"], "one string"),
    (["q"], [["a </Step> b"]], "tag"),
])
def test_validate_paths_names_the_row(questions, paths, match):
    with pytest.raises(VerifierInputError, match=match):
        validate_paths(questions, paths)


def test_token_positions_with_multi_char_tokens():
    offsets = [(0, 3), (3, 4), (4, 10), (10, 11)]
    assert token_positions(offsets, [2, 3, 9, 10]) == [0, 1, 2, 3]


@pytest.mark.parametrize("how, value", [("mean", 0.5), ("min", 0.2), ("prod", 0.2 * 0.5 * 0.8), ("last", 0.8)])
def test_aggregate(how, value):
    assert math.isclose(aggregate([0.2, 0.5, 0.8], how), value)


def test_aggregate_rejects_bad_input():
    with pytest.raises(ValueError):
        aggregate([], "mean")
    with pytest.raises(ValueError):
        aggregate([0.1], "median")


def test_exact_verifier_scores_up_to_the_first_error():
    import random

    rows = generate("test", 20, seed=0)
    verifier = ExactVerifier.from_rows(rows)
    assert isinstance(verifier, Verifier)
    rng = random.Random(0)
    bad_steps, at, _ = corrupt_steps(rows[0], rng, at=0)
    scores = verifier.score([rows[0]["question"], rows[0]["question"]], [rows[0]["steps"], bad_steps])
    assert scores[0] == [1.0] * len(rows[0]["steps"])
    assert scores[1] == [0.0] * len(bad_steps)
    with pytest.raises(KeyError):
        verifier.score(["unknown question"], [["a"]])


@pytest.mark.parametrize("step, result", [("Ben has 7 + 4 = 11 marbles.", "11"),
                                          ("The answer is <ans>16</ans>.", "16"),
                                          ("so x = 3 and y = 42", "42"),
                                          ("no numbers here", "no numbers here")])
def test_result_span(step, result):
    s, e = result_span(step)
    assert step[s:e] == result


def test_confidence_verifier_one_pass_matches_manual_probabilities():
    rows = generate("train", 30, seed=0)
    tok = train_tokenizer([r["question"] + " ".join(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2).eval()
    verifier = ConfidenceVerifier(model, tok, batch_size=2)
    questions = [r["question"] for r in rows[:3]]
    paths = [r["steps"] for r in rows[:3]]
    scores = verifier.score(questions, paths)
    assert [len(s) for s in scores] == [len(p) for p in paths]
    assert all(0.0 <= x <= 1.0 for s in scores for x in s)
    assert verifier.tokens_used > 0
    # The first step's score is the lowest probability of its result tokens, computed by hand.
    lay = layout(questions[0], paths[0])
    enc = tok(lay.text, add_special_tokens=False, return_offsets_mapping=True)
    step = paths[0][0]
    s, e = result_span(step)
    start = lay.step_end_chars[0] - len("</Step>") + 1 - len(step)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=ids).logits[0].float(), -1)
    toks = [k for k, (a, b) in enumerate(enc["offset_mapping"]) if a < start + e and b > start + s]
    expected = min(probs[k - 1, enc["input_ids"][k]].item() for k in toks)
    assert math.isclose(scores[0][0], expected, rel_tol=1e-4)
    # Batching does not change scores.
    single = ConfidenceVerifier(model, tok, batch_size=1).score(questions, paths)
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) for x, y in zip(scores, single) for a, b in zip(x, y))


def _tiny_confidence_setup():
    rows = generate("train", 30, seed=0)
    tok = train_tokenizer([r["question"] + " ".join(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2).eval()
    return rows, tok, model


def _step_token_logprobs(model, tok, question, steps):
    """By hand, per step: the first character of the first token overlapping "<Step> {step}</Step>"
    and the log-probabilities of all those tokens under `model`."""
    lay = layout(question, steps)
    enc = tok(lay.text, add_special_tokens=False, return_offsets_mapping=True)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([enc["input_ids"]])).logits[0].float(), -1)
    out = []
    for end in lay.step_end_chars:
        start = lay.text.rindex("<Step>", 0, end)
        toks = [k for k, (a, b) in enumerate(enc["offset_mapping"]) if a <= end and b > start]
        out.append((lay.text[enc["offset_mapping"][toks[0]][0]],
                    [logp[k - 1, enc["input_ids"][k]].item() for k in toks]))
    return out


def test_step_confidence_reads_every_token_of_the_step_tags_included():
    rows, tok, model = _tiny_confidence_setup()
    questions = [r["question"] for r in rows[:3]]
    paths = [r["steps"] for r in rows[:3]]
    step_scores = ConfidenceVerifier(model, tok, batch_size=2, span="step").score(questions, paths)
    result_scores = ConfidenceVerifier(model, tok, batch_size=2).score(questions, paths)
    # Hand-computed: the lowest probability of any token overlapping "<Step> {step}</Step>".
    for j, (first_char, logps) in enumerate(_step_token_logprobs(model, tok, questions[1], paths[1])):
        assert first_char == "<"
        assert math.isclose(step_scores[1][j], math.exp(min(logps)), rel_tol=1e-4)
    # The step span holds the result span, so its minimum can only be lower.
    assert all(s <= r + 1e-6 for x, y in zip(step_scores, result_scores) for s, r in zip(x, y))
    with pytest.raises(ValueError, match="span"):
        ConfidenceVerifier(model, tok, span="tokens")


def test_step_likelihood_is_the_geometric_mean_of_the_step_token_probabilities(tmp_path):
    """`step-likelihood` reads the same tokens as `step-confidence` and scores a step by the
    geometric mean of their probabilities, by hand; it is at least the minimum; the spec loads it."""
    from reward_models.load import load_verifier

    rows, tok, model = _tiny_confidence_setup()
    questions = [r["question"] for r in rows[:3]]
    paths = [r["steps"] for r in rows[:3]]
    mean_scores = ConfidenceVerifier(model, tok, batch_size=2, span="step", reduce="mean").score(questions, paths)
    min_scores = ConfidenceVerifier(model, tok, batch_size=2, span="step").score(questions, paths)
    for j, (_, logps) in enumerate(_step_token_logprobs(model, tok, questions[2], paths[2])):
        assert math.isclose(mean_scores[2][j], math.exp(sum(logps) / len(logps)), rel_tol=1e-4)
    assert all(m >= n - 1e-6 for x, y in zip(mean_scores, min_scores) for m, n in zip(x, y))
    assert any(m > n + 1e-6 for x, y in zip(mean_scores, min_scores) for m, n in zip(x, y))
    with pytest.raises(ValueError, match="reduce"):
        ConfidenceVerifier(model, tok, span="step", reduce="median")
    model.save_pretrained(tmp_path / "pol")
    tok.save_pretrained(tmp_path / "pol")
    loaded = load_verifier(f"step-likelihood:{tmp_path / 'pol'}")
    assert loaded.span == "step" and loaded.reduce == "mean"


class _Fixed:
    """A verifier returning given scores, for combination tests."""

    def __init__(self, scores, tokens):
        self.scores, self.tokens_used, self.calls = scores, 0, 0
        self._tokens = tokens

    def score(self, questions, paths):
        self.calls += 1
        self.tokens_used += self._tokens
        return [list(s) for s in self.scores]


def test_combined_verifier_product_and_min():
    from reward_models.combined import CombinedVerifier

    a = _Fixed([[0.5, 1.0], [0.2]], tokens=10)
    b = _Fixed([[0.8, 0.1], [0.9]], tokens=7)
    paths = [["s1", "s2"], ["t1"]]
    prod = CombinedVerifier([a, b], "product").score(["q", "r"], paths)
    assert [[round(x, 6) for x in p] for p in prod] == [[0.4, 0.1], [0.18]]
    both = CombinedVerifier([a, b], "min")
    assert both.score(["q", "r"], paths) == [[0.5, 0.1], [0.2]]
    assert isinstance(both, Verifier) and both.tokens_used == 34  # both parts read, twice each
    with pytest.raises(ValueError, match="rule"):
        CombinedVerifier([a, b], "max")
    with pytest.raises(ValueError, match="two parts"):
        CombinedVerifier([a], "min")
    short = _Fixed([[0.5], [0.2]], tokens=1)
    with pytest.raises(ValueError, match="row 0"):
        CombinedVerifier([a, short]).score(["q", "r"], paths)
    with pytest.raises(VerifierInputError, match="zero steps"):
        CombinedVerifier([a, b]).score(["q"], [[]])


def test_verifier_separation_pairs_and_shares(tmp_path):
    """The separation probe pairs each gold solution with the teacher's misreading at the step
    where they first differ (which the checker calls that misreading), the exact checker
    separates every pair, and a verifier that prefers the misreading separates none."""
    import json

    from experiments.verifier_separation import main, pairs_of, separation
    from reasoning.world import error_kind, generate

    rows = generate("dev", 80, 0)
    pairs = pairs_of(rows)
    assert {p["kind"] for p in pairs} == {"inverse", "stale"}
    for p in pairs:
        assert p["gold"][: p["first"]] == p["bad"][: p["first"]] and p["gold"][p["first"]] != p["bad"][p["first"]]
        assert error_kind(p["row"], p["bad"]) == f"misread_{p['kind']}"
    backwards = separation(pairs, [[0.2] * len(p["gold"]) for p in pairs], [[0.9] * len(p["bad"]) for p in pairs])
    assert backwards["first_diff_gold_higher"] == 0.0 and backwards["min_gold_higher"] == 0.0
    assert separation([], [], [])["first_diff_gold_higher"] is None

    out = tmp_path / "sep.json"
    assert main(["--verifier", "exact", "--n", "80", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["pairs"] == len(pairs)
    assert result["first_diff_gold_higher"] == 1.0 and result["min_gold_higher"] == 1.0
    assert set(result["by_kind"]) == {"inverse", "stale"}
    assert main(["--verifier", "exact", "--n", "0"]) == 2


def test_reward_agreement_figures_by_hand(tmp_path):
    """Within-group pair accuracy and advantage correlation, computed by hand: ties count half,
    groups whose samples all agree give no pair, a score that orders samples as the answer check
    does scores 1.0, a constant score 0.5, a reversed one 0.0; samples without steps rank last."""
    import json

    from tiny_world_policy import save_tiny_world_policy

    from experiments.reward_agreement import advantage_corr, main, pair_accuracy, report

    right = [True, False, False, True]  # one group of 4: 2 right x 2 wrong = 4 pairs
    assert pair_accuracy([([0.9, 0.1, 0.2, 0.8], right)]) == (1.0, 4)
    assert pair_accuracy([([0.5] * 4, right)]) == (0.5, 4)
    assert pair_accuracy([([0.1, 0.9, 0.8, 0.2], right)]) == (0.0, 4)
    # right 0.6 beats 0.5 and ties 0.6; right 0.4 loses to both: (1 + 0.5 + 0 + 0) / 4
    assert pair_accuracy([([0.6, 0.5, 0.6, 0.4], right)]) == (0.375, 4)
    assert pair_accuracy([([0.3, 0.2], [True, True])]) == (None, 0)
    assert advantage_corr([([0.9, 0.1, 0.1, 0.9], right), ([0.3, 0.2], [False, False])]) == pytest.approx(1.0)
    assert advantage_corr([([0.3, 0.2], [True, True])]) is None
    # min / mean / last of the step scores: min puts the path with the 0.1 step last
    steps = [[0.9, 0.1], [0.5, 0.6], [0.7, 0.7], None]
    got = report(steps, [True, False, True, False], k=4)
    assert got["pairs"] == 4
    assert got["min"]["pair_accuracy"] == 0.75  # 0.1 < 0.5 loses one pair; None ranks last
    assert got["last"]["pair_accuracy"] == 0.75  # 0.1 below 0.6 again
    assert got["mean"]["pair_accuracy"] == 0.75  # 0.5 < 0.55

    policy = save_tiny_world_policy(tmp_path / "policy")
    out = tmp_path / "agree.json"
    spec = f"step-confidence:{policy}"
    assert main(["--policy", str(policy), "--verifier", spec, "--ratio", f"{spec},{spec}", "--n", "6",
                 "--k", "3", "--max_new_tokens", "24", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["n"] == 6 and result["k"] == 3 and 0.0 <= result["sampled_accuracy"] <= 1.0
    ratio = result["verifiers"][f"log({spec}) - log({spec})"]
    assert ratio["pairs"] == result["verifiers"][spec]["pairs"]  # the same samples for every candidate
    assert result["gold"]["pair_accuracy"] == (1.0 if ratio["pairs"] else None)
    assert main(["--policy", str(policy), "--verifier", spec, "--k", "1"]) == 2
    assert main(["--policy", str(policy), "--verifier", spec, "--ratio", f"{spec},exact"]) == 2
