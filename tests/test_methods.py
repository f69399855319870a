"""Inference methods (greedy, self-consistency, Best-of-N, StepCo, PathCo) on a scripted generator
and verifier (method logic), then once each on a tiny real model with the exact verifier."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from backends.base import Completion, SamplingParams
from inference.methods import best_of_n, greedy, pathco, self_consistency, stepco
from inference.methods.base import Tracker, answer_key, blind, majority_vote
from reasoning.grading import is_correct
from reasoning.prompts import revise_prompt, solve_prompt
from reasoning.steps import join_steps, prefix_text
from reasoning.types import Problem
from reasoning.world import WorldConfig, corrupt_steps, earliest_error, generate, row_to_problem
from reward_models.exact import ExactVerifier
from reward_models.verifier import VerifierInputError, validate_paths

# ----------------------------------------------------------------------------------------------
# scripted fakes


@dataclass
class Reply:
    text: str
    finish_reason: str = "stop"


class ScriptedGenerator:
    """Canned completions keyed by prompt: a list of replies is returned n at a time, cycling.

    Tokens are counted as whitespace-separated words, so tests can compute what each problem spent.
    """

    def __init__(self, script: dict[str, list[str | Reply] | str | Reply]):
        self.script = script
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        self.calls.append((list(prompts), params))
        out = []
        for prompt in prompts:
            if prompt not in self.script:
                raise KeyError(f"unscripted prompt:\n{prompt}")
            replies = self.script[prompt]
            replies = replies if isinstance(replies, list) else [replies]
            row = []
            for j in range(params.n):
                r = replies[j % len(replies)]
                r = r if isinstance(r, Reply) else Reply(r)
                row.append(Completion(r.text, len(prompt.split()), len(r.text.split()), r.finish_reason))
            out.append(row)
        return out


class ScriptedVerifier:
    """Step score from a function of (question, steps so far); 1.0 / 0.0 by a 'BAD' marker by default.

    Refuses what real verifiers refuse (`validate_paths`) and, like a context limit, any step
    containing 'HUGE'. Counts tokens (characters) and records every call.
    """

    def __init__(self, fn=None):
        self.fn = fn or (lambda q, steps: 0.0 if "BAD" in steps[-1] else 1.0)
        self.tokens_used = 0
        self.calls: list[list[list[str]]] = []

    def score(self, questions, paths):
        validate_paths(questions, paths)
        for i, p in enumerate(paths):
            if any("HUGE" in s for s in p):
                raise VerifierInputError(f"row {i}: longer than the context")
        self.calls.append([list(p) for p in paths])
        self.tokens_used += sum(len(q) + sum(len(s) for s in p) for q, p in zip(questions, paths))
        return [[self.fn(q, list(p[: k + 1])) for k in range(len(p))] for q, p in zip(questions, paths)]


def problem(i: int, question: str | None = None) -> Problem:
    return Problem(id=f"p{i}", question=question or f"Question number {i}: what is it?", answer="")


def tracker_for(gen, n, verifier=None) -> Tracker:
    return Tracker(gen, verifier, n)


def path(*steps: str) -> str:
    return join_steps(list(steps))


# ----------------------------------------------------------------------------------------------
# shared helpers


def test_answer_key_normalises_equivalent_answers():
    assert answer_key("5") == answer_key("5.0") == answer_key("$5") == answer_key("10/2") == answer_key("5 apples")
    assert answer_key("5") != answer_key("6")
    assert answer_key("\\frac{1}{2}", "latex") == answer_key("0.5", "latex")
    assert answer_key("\\left( 3, 4 \\right)", "latex") == answer_key("(3,4)", "latex")
    assert answer_key("(C)", "choice") == answer_key("C", "choice") == answer_key("c) 21", "choice")
    assert answer_key("Even", "text") == answer_key("even.", "text")
    assert answer_key(None) is None and answer_key("  ") is None


def test_majority_vote_ties_go_to_first_seen_and_missing_answers_do_not_vote():
    assert majority_vote([None, "7", "5", "5.0", "7", None]) == (1, {"number:7": 2, "number:5": 2})
    winner, votes = majority_vote([None, "3", "4", "4"])
    assert winner == 2 and votes == {"number:3": 1, "number:4": 2}
    assert majority_vote([None, None]) == (None, {})


# ----------------------------------------------------------------------------------------------
# greedy


def test_greedy_predicts_and_flags_bad_outputs_with_per_problem_tokens():
    probs = [problem(0), problem(1, "A much longer question with many more words in it?"), problem(2), problem(3)]
    texts = [path("two plus three is 5.", "The answer is <ans>5</ans>."),
             "<Step> two plus", "", "no tags at all here"]
    finish = ["stop", "length", "stop", "stop"]
    gen = ScriptedGenerator({solve_prompt(p.question): Reply(t, f) for p, t, f in zip(probs, texts, finish)})
    tracker = tracker_for(gen, 4)
    out = greedy.run(probs, tracker, greedy.Config(max_new_tokens=7))
    assert len(gen.calls) == 1 and gen.calls[0][1].temperature == 0 and gen.calls[0][1].max_new_tokens == 7
    assert out[0].prediction == "5" and out[0].flags == []
    assert set(out[1].flags) == {"truncated", "unclosed_tags", "no_answer"}
    assert set(out[2].flags) == {"empty_output", "no_steps", "no_answer"} and out[2].prediction is None
    assert set(out[3].flags) == {"no_tags", "no_answer"}
    for p, t, o in zip(probs, texts, out):
        assert o.usage.prompt_tokens == len(solve_prompt(p.question).split())
        assert o.usage.completion_tokens == len(t.split()) and o.usage.llm_calls == 1


# ----------------------------------------------------------------------------------------------
# self-consistency


def test_self_consistency_votes_on_normalised_answers():
    probs = [problem(0), problem(1), problem(2)]
    a = lambda x: path("work", f"The answer is <ans>{x}</ans>.")  # noqa: E731
    gen = ScriptedGenerator({
        solve_prompt(probs[0].question): [a(7), a("5"), a("5.0"), "", a("$5"), a(7)],
        solve_prompt(probs[1].question): [a(3), a(4), a(4), a(3)],  # tie: first seen wins
        solve_prompt(probs[2].question): ["", Reply("", "length")] * 3,
    })
    tracker = tracker_for(gen, 3)
    out = self_consistency.run(probs, tracker, self_consistency.Config(n=6, temperature=0.7, seed=3))
    params = gen.calls[0][1]
    assert len(gen.calls) == 1 and (params.n, params.temperature, params.seed) == (6, 0.7, 3)
    assert out[0].prediction == "5" and out[0].completion == a("5")
    assert out[0].trace["votes"] == {"number:7": 2, "number:5": 3}
    assert out[0].trace["answers"][3] is None and Counter(out[0].flags)["no_answer"] == 1
    assert out[1].prediction == "3"
    assert out[2].prediction is None and "no_votes" in out[2].flags
    assert Counter(out[2].flags)["truncated"] == 3 and Counter(out[2].flags)["no_steps"] == 6
    assert all(o.usage.llm_calls == 6 for o in out)


# ----------------------------------------------------------------------------------------------
# best-of-n


def test_best_of_n_aggregation_choice_changes_the_pick():
    # sample A: scores .9 .9 .1 (mean .63, min .1); sample B: .6 .6 .6 (mean .6, min .6)
    a = path("a1", "a2", "The answer is <ans>1</ans>.")
    b = path("b1", "b2", "The answer is <ans>2</ans>.")
    table = {"a1": 0.9, "a2": 0.9, "The answer is <ans>1</ans>.": 0.1, "b1": 0.6, "b2": 0.6,
             "The answer is <ans>2</ans>.": 0.6}
    p = problem(0)
    picks = {}
    for how in ("mean", "min", "prod", "last"):
        gen = ScriptedGenerator({solve_prompt(p.question): [a, b]})
        verifier = ScriptedVerifier(lambda q, steps: table[steps[-1]])
        out = best_of_n.run([p], tracker_for(gen, 1, verifier), best_of_n.Config(n=2, aggregation=how))[0]
        picks[how] = out.prediction
        assert len(verifier.calls) == 1 and out.trace["aggregation"] == how
        assert out.trace["samples"][0]["step_scores"] == [0.9, 0.9, 0.1]
    assert picks == {"mean": "1", "min": "2", "prod": "2", "last": "2"}
    with pytest.raises(ValueError, match="aggregation"):
        best_of_n.Config(aggregation="max")


def test_best_of_n_unscorable_samples_and_majority_fallback():
    probs = [problem(0), problem(1), problem(2)]
    good = path("fine", "The answer is <ans>4</ans>.")
    bad = path("BAD", "The answer is <ans>9</ans>.")
    huge = path("HUGE step", "The answer is <ans>8</ans>.")
    gen = ScriptedGenerator({
        solve_prompt(probs[0].question): ["", bad, good, huge],
        solve_prompt(probs[1].question): ["", "", "", ""],
        solve_prompt(probs[2].question): ["", "", "The answer is 6", "6 again"],
    })
    verifier = ScriptedVerifier()
    tracker = tracker_for(gen, 3, verifier)
    out = best_of_n.run(probs, tracker, best_of_n.Config(n=4))
    assert out[0].prediction == "4" and out[0].trace["chosen"] == 2
    assert [s["score"] for s in out[0].trace["samples"]] == [None, 0.5, 1.0, None]
    assert Counter(out[0].flags)["unscorable"] == 2  # the empty one and the one the verifier refused
    assert out[1].prediction is None and {"fallback_majority_vote", "no_votes"} <= set(out[1].flags)
    # problem 2's untagged outputs still have steps, so they are scored and the best one is picked
    assert out[2].prediction == "6" and out[2].trace["chosen_by"] == "verifier"
    # verifier tokens: each problem pays for its own paths and the total is exact
    assert out[1].usage.verifier_tokens == 0 and out[1].usage.verifier_calls == 0
    assert sum(o.usage.verifier_tokens for o in out) == verifier.tokens_used > 0
    assert out[0].usage.verifier_calls >= 2 and out[2].usage.verifier_calls == 2


def test_best_of_n_falls_back_to_majority_when_nothing_scores():
    p = problem(0)
    gen = ScriptedGenerator({solve_prompt(p.question): ["", path("HUGE", "<ans>3</ans>"),
                                                        path("HUGE", "<ans>3</ans>")]})
    out = best_of_n.run([p], tracker_for(gen, 1, ScriptedVerifier()), best_of_n.Config(n=3))[0]
    assert out.prediction == "3" and out.trace["chosen_by"] == "majority_vote" and out.trace["chosen"] == 1
    assert "fallback_majority_vote" in out.flags and Counter(out.flags)["unscorable"] == 3


# ----------------------------------------------------------------------------------------------
# StepCo


Q = "Tom has 3 apples and buys 4. How many?"
PAPER = {"threshold": 0.5, "revision": "prompt"}
"""The paper's settings; the defaults (`auto`) are chosen by the harness (`inference.chosen_settings`)."""


def test_stepco_splices_kept_steps_verbatim_and_stops_when_all_pass():
    p = problem(0, Q)
    initial = ["Tom has 3 apples.", "He buys 4 BAD so 3 * 4 = 12.", "The answer is <ans>12</ans>."]
    # The model, asked to revise from step 2, also rewrites step 1: its text is taken as steps 2..
    # and the kept step 1 is spliced back as it was.
    reply = path("He buys 4 so 3 + 4 = 7.", "The answer is <ans>7</ans>.")
    gen = ScriptedGenerator({solve_prompt(Q): join_steps(initial), revise_prompt(Q, initial, 2, 0.0): reply})
    verifier = ScriptedVerifier()
    out = stepco.run([p], tracker_for(gen, 1, verifier), stepco.Config(**PAPER))[0]
    final = out.trace["rounds"][-1]["steps"]
    assert final == ["Tom has 3 apples.", "He buys 4 so 3 + 4 = 7.", "The answer is <ans>7</ans>."]
    assert out.prediction == "7" and out.trace["stopped"] == "accepted" and out.trace["revisions"] == 1
    assert out.completion == prefix_text(initial[:1]) + reply
    assert [e["revised_index"] for e in out.trace["rounds"]] == [None, 2]
    assert [e["scores"] for e in out.trace["rounds"]] == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert gen.calls[1][0][0].endswith(prefix_text(initial[:1]))  # the revise prompt ends with the kept steps
    assert len(verifier.calls) == 2 and out.flags == []


def test_stepco_revision_index_never_moves_backwards():
    """A verifier whose step-1 score drops once step 3 exists (non-causal): the index stays at 2."""
    p = problem(0, Q)
    v0 = ["s1", "s2 BAD", "<ans>1</ans>"]
    v1 = ["s1", "s2 ok", "s3 BAD", "<ans>2</ans>"]
    v2 = ["s1", "s2 fixed", "<ans>3</ans>"]

    verifier = ScriptedVerifier()  # a step scores 0 when it says BAD
    original_score = verifier.score

    def score(questions, paths):  # step 1 looks bad whenever a later step is 's3 BAD' (non-causal)
        out = original_score(questions, paths)
        for k, pth in enumerate(paths):
            if "s3 BAD" in pth:
                out[k][0] = 0.2
        return out

    verifier.score = score
    gen = ScriptedGenerator({
        solve_prompt(Q): join_steps(v0),
        revise_prompt(Q, v0, 2, 0.0): join_steps(v1[1:]),
        revise_prompt(Q, v1, 2, 1.0): join_steps(v2[1:]),
    })
    out = stepco.run([p], tracker_for(gen, 1, verifier), stepco.Config(**PAPER))[0]
    rounds = out.trace["rounds"]
    assert [e["revised_index"] for e in rounds] == [None, 2, 2]
    assert rounds[1]["scores"][0] == 0.2  # step 1 was rejected, yet it is kept
    assert all(e["steps"][0] == "s1" for e in rounds)
    assert out.prediction == "3" and out.trace["stopped"] == "accepted"


def test_stepco_index_moves_forward():
    p = problem(0, Q)
    v0 = ["s1 BAD", "<ans>1</ans>"]
    v1 = ["s1 ok", "s2 BAD", "<ans>2</ans>"]
    v2 = ["s1 ok", "s2 ok", "<ans>3</ans>"]
    gen = ScriptedGenerator({
        solve_prompt(Q): join_steps(v0),
        revise_prompt(Q, v0, 1, 0.0): join_steps(v1),
        revise_prompt(Q, v1, 2, 0.0): join_steps(v2[1:]),
    })
    out = stepco.run([p], tracker_for(gen, 1, ScriptedVerifier()), stepco.Config(**PAPER))[0]
    assert [e["revised_index"] for e in out.trace["rounds"]] == [None, 1, 2]
    assert out.trace["rounds"][-1]["steps"] == v2 and out.prediction == "3"


def test_stepco_stops_after_max_rounds_and_verify_final():
    p = problem(0, Q)
    v0 = ["s1", "s2 BAD <ans>1</ans>"]
    # every revision is rejected again; the revise prompt is the same each round (same path, same p)
    gen = ScriptedGenerator({solve_prompt(Q): join_steps(v0), revise_prompt(Q, v0, 2, 0.0): join_steps(v0[1:])})
    for verify_final, verifier_calls in ((True, 4), (False, 3)):
        verifier = ScriptedVerifier()
        gen.calls.clear()
        cfg = stepco.Config(**PAPER, max_rounds=3, verify_final=verify_final)
        out = stepco.run([p], tracker_for(gen, 1, verifier), cfg)[0]
        assert out.trace["stopped"] == "max_rounds" and out.trace["revisions"] == 3
        assert len(out.trace["rounds"]) == 4 and len(gen.calls) == 4
        assert len(verifier.calls) == verifier_calls
        assert (out.trace["rounds"][-1]["scores"] is None) == (not verify_final)
        assert out.prediction == "1" and out.usage.llm_calls == 4 and out.usage.verifier_calls == verifier_calls
    out = stepco.run([p], tracker_for(gen, 1, ScriptedVerifier()), stepco.Config(**PAPER, max_rounds=0))[0]
    assert out.trace["revisions"] == 0 and out.trace["stopped"] == "max_rounds"


def test_stepco_unusable_truncated_and_unverifiable_paths_are_counted():
    probs = [problem(0, Q), problem(1, "Empty question?"), problem(2, "Cut question?")]
    v0 = ["s1", "s2 BAD", "<ans>1</ans>"]
    c0 = ["c1 BAD", "<ans>5</ans>"]
    gen = ScriptedGenerator({
        solve_prompt(Q): join_steps(v0),
        revise_prompt(Q, v0, 2, 0.0): [""],  # no usable steps, every time
        solve_prompt("Empty question?"): "",
        solve_prompt("Cut question?"): join_steps(c0),
        revise_prompt("Cut question?", c0, 1, 0.0): Reply("<Step> c1 fixed", "length"),
    })
    verifier = ScriptedVerifier()
    out = stepco.run(probs, tracker_for(gen, 3, verifier), stepco.Config(**PAPER, max_rounds=2))
    # problem 0: the previous path and its scores are kept (not re-scored); tries again each round
    f0 = Counter(out[0].flags)
    assert f0["revision_unusable"] == 2 and f0["empty_output"] == 2
    assert out[0].trace["rounds"][-1]["steps"] == v0 and out[0].trace["stopped"] == "max_rounds"
    assert out[0].usage.verifier_calls == 1 and out[0].prediction == "1"
    # problem 1: zero steps, never verified
    assert out[1].trace["stopped"] == "unverifiable" and {"unverifiable", "no_steps"} <= set(out[1].flags)
    assert out[1].usage.verifier_calls == 0 and out[1].usage.llm_calls == 1 and out[1].prediction is None
    # problem 2: a truncated revision with a partial step is used, counted, and verified
    assert {"truncated", "unclosed_tags"} <= set(out[2].flags)
    assert out[2].trace["rounds"][1]["steps"] == ["c1 fixed"] and out[2].trace["stopped"] == "accepted"
    # one generate call and one score call per round, for all problems together
    assert [len(prompts) for prompts, _ in gen.calls] == [3, 2, 1]
    assert [len(c) for c in verifier.calls] == [2, 1]


def test_stepco_resample_mode_continues_the_kept_steps():
    p = problem(0, Q)
    v0 = ["s1", "s2 BAD", "<ans>1</ans>"]
    gen = ScriptedGenerator({solve_prompt(Q): join_steps(v0),
                             solve_prompt(Q, ["s1"]): join_steps(["s2 ok", "<ans>2</ans>"])})
    cfg = stepco.Config(threshold=0.5, revision="resample", resample_temperature=0.9, seed=5)
    out = stepco.run([p], tracker_for(gen, 1, ScriptedVerifier()), cfg)[0]
    assert out.prediction == "2" and out.trace["rounds"][-1]["steps"] == ["s1", "s2 ok", "<ans>2</ans>"]
    assert gen.calls[0][1].temperature == 0.0 and (gen.calls[1][1].temperature, gen.calls[1][1].seed) == (0.9, 6)
    with pytest.raises(ValueError, match="revision"):
        stepco.Config(revision="rewrite")


def test_stepco_token_attribution_per_problem():
    probs = [problem(0, Q), problem(1, "Short?")]
    v0 = ["s1", "s2 BAD", "<ans>1</ans>"]
    ok = ["fine", "<ans>2</ans>"]
    revise = revise_prompt(Q, v0, 2, 0.0)
    fixed = join_steps(["s2 ok", "<ans>3</ans>"])
    gen = ScriptedGenerator({solve_prompt(Q): join_steps(v0), revise: fixed, solve_prompt("Short?"): join_steps(ok)})
    verifier = ScriptedVerifier()
    out = stepco.run(probs, tracker_for(gen, 2, verifier), stepco.Config(**PAPER))
    assert out[0].usage.prompt_tokens == len(solve_prompt(Q).split()) + len(revise.split())
    assert out[0].usage.completion_tokens == len(join_steps(v0).split()) + len(fixed.split())
    assert out[1].usage.prompt_tokens == len(solve_prompt("Short?").split()) and out[1].usage.llm_calls == 1
    assert (out[0].usage.verifier_calls, out[1].usage.verifier_calls) == (2, 1)
    assert out[0].usage.verifier_tokens + out[1].usage.verifier_tokens == verifier.tokens_used
    assert out[0].usage.total_tokens > out[1].usage.total_tokens > 0



def _sums(records, *keys):
    return tuple(sum(r[k] for r in records) for k in keys)


def test_sampling_traces_record_each_samples_tokens_and_they_add_up_to_the_usage():
    probs = [problem(0), problem(1, "A much longer question, with more words to read?")]
    a = lambda x, pad="": path(f"work {pad}", f"The answer is <ans>{x}</ans>.")  # noqa: E731
    gen = ScriptedGenerator({solve_prompt(probs[0].question): [a(1), a(2, "and a much longer step"), "", a(1)],
                             solve_prompt(probs[1].question): [a(3, "x y z"), path("HUGE", "<ans>4</ans>")]})
    sc = self_consistency.run(probs, tracker_for(gen, 2), self_consistency.Config(n=4))
    for o, prompt in zip(sc, [solve_prompt(p.question) for p in probs]):
        t = o.trace
        assert t["prompt_tokens"] == [len(prompt.split())] * 4
        assert t["completion_tokens"] == [len(x.split()) for x in t["samples"]]
        assert (sum(t["prompt_tokens"]), sum(t["completion_tokens"])) == (o.usage.prompt_tokens,
                                                                          o.usage.completion_tokens)
    verifier = ScriptedVerifier()
    bon = best_of_n.run(probs, tracker_for(gen, 2, verifier), best_of_n.Config(n=4))
    for o in bon:
        samples = o.trace["samples"]
        assert [s["completion_tokens"] for s in samples] == [len(s["text"].split()) for s in samples]
        assert _sums(samples, "prompt_tokens", "completion_tokens", "verifier_tokens") == (
            o.usage.prompt_tokens, o.usage.completion_tokens, o.usage.verifier_tokens)
        # an unscored sample (no steps, or refused) was charged no verifier tokens; a longer path more
        assert all(s["verifier_tokens"] == 0 for s in samples if s["score"] is None)
    first = bon[0].trace["samples"]
    assert first[1]["verifier_tokens"] > first[0]["verifier_tokens"] > 0
    assert sum(o.usage.verifier_tokens for o in bon) == verifier.tokens_used


def test_stepco_rounds_record_their_tokens_and_they_add_up_to_the_usage():
    probs = [problem(0, Q), problem(1, "Short?"), problem(2, "Stuck?")]
    v0 = ["s1", "s2 BAD", "<ans>1</ans>"]
    s0 = ["t1 BAD", "<ans>7</ans>"]
    revise = revise_prompt(Q, v0, 2, 0.0)
    gen = ScriptedGenerator({solve_prompt(Q): join_steps(v0), revise: join_steps(["s2 ok", "<ans>3</ans>"]),
                             solve_prompt("Short?"): join_steps(["fine", "<ans>2</ans>"]),
                             solve_prompt("Stuck?"): join_steps(s0), revise_prompt("Stuck?", s0, 1, 0.0): ""})
    verifier = ScriptedVerifier()
    out = stepco.run(probs, tracker_for(gen, 3, verifier), stepco.Config(**PAPER, max_rounds=2))
    for o in out:
        rounds = o.trace["rounds"]
        assert _sums(rounds, "prompt_tokens", "completion_tokens", "verifier_tokens") == (
            o.usage.prompt_tokens, o.usage.completion_tokens, o.usage.verifier_tokens)
    r0 = out[0].trace["rounds"]
    assert [r["prompt_tokens"] for r in r0] == [len(solve_prompt(Q).split()), len(revise.split())]
    assert all(r["verifier_tokens"] > 0 for r in r0)  # both paths verified
    stuck = out[2].trace["rounds"]  # unusable revisions: generated (counted), not verified again
    assert [r.get("unusable", False) for r in stuck] == [False, True, True]
    assert stuck[0]["verifier_tokens"] > 0 and [r["verifier_tokens"] for r in stuck[1:]] == [0, 0]
    assert sum(o.usage.verifier_tokens for o in out) == verifier.tokens_used

def test_stepco_with_exact_verifier_corrects_a_wrong_path():
    rows = generate("test", 3, 0, WorldConfig(min_steps=2, max_steps=3))
    script = {}
    for r in rows:
        wrong, _, _ = corrupt_steps(r, random.Random(0), at=1)
        k = earliest_error(r, wrong) + 1
        assert k >= 2 and wrong[: k - 1] == r["steps"][: k - 1]
        script[solve_prompt(r["question"])] = join_steps(wrong)
        script[revise_prompt(r["question"], wrong, k, 0.0)] = join_steps(r["steps"][k - 1 :])
    problems = blind([row_to_problem(r) for r in rows])
    gen = ScriptedGenerator(script)
    out = stepco.run(problems, tracker_for(gen, 3, ExactVerifier.from_rows(rows)), stepco.Config(**PAPER))
    for r, o in zip(rows, out):
        assert not is_correct(o.trace["rounds"][0]["steps"][-1].split("<ans>")[1].split("</ans>")[0], r["answer"])
        assert is_correct(o.prediction, r["answer"]), o.trace
        assert o.trace["rounds"][-1]["steps"] == r["steps"] and o.trace["stopped"] == "accepted"
        assert o.trace["rounds"][-1]["scores"] == [1.0] * len(r["steps"])


# ----------------------------------------------------------------------------------------------
# PathCo


def test_pathco_revises_the_whole_path_on_a_low_mean():
    probs = [problem(0, Q), problem(1, "Other?")]
    low = ["s1", "s2 BAD", "s3 BAD", "s4 BAD <ans>1</ans>"]  # mean 0.25: revised
    passing = ["t1", "t2 BAD", "<ans>4</ans>"]  # mean 0.67 >= 0.5: accepted although step 2 fails
    new = ["n1", "n2", "<ans>2</ans>"]
    gen = ScriptedGenerator({
        solve_prompt(Q): join_steps(low),
        revise_prompt(Q, low, 1, 0.25): join_steps(new),
        solve_prompt("Other?"): join_steps(passing),
    })
    out = pathco.run(probs, tracker_for(gen, 2, ScriptedVerifier()), pathco.Config(revision="prompt"))
    assert [e["revised_index"] for e in out[0].trace["rounds"]] == [None, 1]
    assert out[0].trace["rounds"][-1]["steps"] == new and out[0].prediction == "2"
    assert out[1].trace["revisions"] == 0 and out[1].trace["stopped"] == "accepted" and out[1].prediction == "4"
    # StepCo on the same passing path would revise step 2
    gen2 = ScriptedGenerator({solve_prompt("Other?"): join_steps(passing),
                              revise_prompt("Other?", passing, 2, 0.0): join_steps(["t2 ok", "<ans>5</ans>"])})
    assert stepco.run([probs[1]], tracker_for(gen2, 1, ScriptedVerifier()), stepco.Config(**PAPER))[0].prediction == "5"


def test_pathco_resample_draws_a_fresh_path():
    p = problem(0, Q)
    gen = ScriptedGenerator({solve_prompt(Q): [join_steps(["x BAD", "y BAD <ans>1</ans>"])]})
    out = pathco.run([p], tracker_for(gen, 1, ScriptedVerifier()), pathco.Config(revision="resample", max_rounds=2))[0]
    # the scripted sampler repeats itself, so both revisions are rejected again
    assert [e["revised_index"] for e in out.trace["rounds"]] == [None, 1, 1]
    assert [c[0] for c in gen.calls] == [[solve_prompt(Q)]] * 3 and gen.calls[1][1].temperature == 0.8
    assert out.trace["stopped"] == "max_rounds"


@pytest.mark.parametrize("name", ["greedy", "self_consistency", "best_of_n", "stepco", "pathco"])
def test_no_problems_no_calls(name):
    gen, verifier = ScriptedGenerator({}), ScriptedVerifier()
    module = {"greedy": greedy, "self_consistency": self_consistency, "best_of_n": best_of_n,
              "stepco": stepco, "pathco": pathco}[name]
    chosen = {"stepco": PAPER, "pathco": {"revision": "prompt"}}.get(name, {})  # `auto` is the harness's to choose
    assert module.run([], tracker_for(gen, 0, verifier), module.Config(**chosen)) == []
    assert gen.calls == [] and verifier.calls == []


@pytest.mark.parametrize("module", [stepco, pathco])
def test_revision_and_threshold_left_to_auto_are_refused_by_the_method_itself(module):
    assert module.Config().revision == "auto"
    with pytest.raises(ValueError, match="revision=auto.*inference.evaluate"):
        module.run([problem(0, Q)], tracker_for(ScriptedGenerator({}), 1, ScriptedVerifier()), module.Config())


# ----------------------------------------------------------------------------------------------
# a real tiny model, end to end, with the exact verifier

WORLD = WorldConfig(min_steps=1, max_steps=2)


@pytest.fixture(scope="module")
def tiny():
    """An untrained tiny Llama and a small BPE tokenizer trained on world text (offline), and 3
    world problems with the exact verifier."""
    from backends.hf import HFGenerator
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    train = generate("train", 60, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in train], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    rows = generate("test", 3, 0, WORLD)
    return HFGenerator(model, tok, batch_size=16), rows


CONFIGS = {
    "greedy": greedy.Config(max_new_tokens=24),
    "self_consistency": self_consistency.Config(n=3, max_new_tokens=24),
    "best_of_n": best_of_n.Config(n=3, max_new_tokens=24, aggregation="min"),
    # sampled initial paths: the untrained model's greedy output is blank, which would stop the
    # loop before any verification
    "stepco": stepco.Config(**PAPER, max_rounds=2, max_new_tokens=24, temperature=1.0),
    "pathco": pathco.Config(max_rounds=2, max_new_tokens=24, temperature=1.0, revision="resample"),
}
MODULES = {"greedy": greedy, "self_consistency": self_consistency, "best_of_n": best_of_n,
           "stepco": stepco, "pathco": pathco}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_methods_run_end_to_end_on_a_tiny_model(tiny, name):
    generator, rows = tiny
    problems = blind([row_to_problem(r) for r in rows])
    verifier = ExactVerifier.from_rows(rows)
    tracker = Tracker(generator, verifier, len(problems))
    out = MODULES[name].run(problems, tracker, CONFIGS[name])
    assert len(out) == len(problems)
    for o in out:
        assert o.usage.prompt_tokens > 0 and o.usage.completion_tokens > 0 and o.usage.llm_calls >= 1
        assert o.prediction is None or isinstance(o.prediction, str)
        assert all(isinstance(f, str) for f in o.flags)
    if name in ("best_of_n", "stepco", "pathco"):
        assert sum(o.usage.verifier_calls for o in out) > 0
    if name in ("stepco", "pathco"):  # the untrained model's paths are wrong: the loop revises them
        assert sum(o.trace["revisions"] for o in out) > 0
        assert all(len(o.trace["rounds"]) == o.trace["revisions"] + 1 for o in out)


def test_stepco_flags_reads_answer_changes_and_flag_positions():
    """experiments/stepco_flags.py: the first flagged step placed against the checker's earliest error,
    a revision from that step counted as fixing it when the next path is right there, and the
    answer change from the initial path to the final one."""
    from experiments.stepco_flags import analyse, flag_position
    from reasoning.world import generate, teacher_solution

    assert flag_position(3, 3, None) == "accepted_right" and flag_position(3, 3, 0) == "false_alarm"
    assert flag_position(1, 3, None) == "missed" and flag_position(1, 3, 1) == "at_error"
    assert flag_position(1, 3, 0) == "before_error" and flag_position(1, 3, 2) == "after_error"
    assert flag_position(1, 3, 0, path_level=True) == "flagged_erroneous"

    row = next(r for r in generate("dev", 80, 0) if teacher_solution(r, ("inverse",)))
    bad = teacher_solution(row, ("inverse",))
    first_diff = next(i for i, (g, b) in enumerate(zip(row["steps"], bad)) if g != b)
    trace = {"rounds": [{"round": 0, "steps": bad, "scores": [0.9] * len(bad), "revised_index": None},
                        {"round": 1, "steps": row["steps"], "scores": [0.9] * len(row["steps"]),
                         "revised_index": first_diff + 1}]}
    result = {"id": row["id"], "question": row["question"], "answer": row["answer"], "correct": True, "trace": trace}
    got = analyse([result, {**result, "question": "not a world question"}], {row["question"]: row})
    assert got["problems"] == 1 and got["skipped"] == 1
    assert got["answer_changes"] == {"incorrect_to_correct": 1} and got["net_gain"] == 1
    assert got["first_flag"] == {"at_error": 1}
    assert got["revision_fixed_the_error"] == 1 and got["fixed_and_final_right"] == 1


def test_stepco_and_pathco_share_the_revision_loops_settings():
    """StepCo's and PathCo's settings are one RevisionConfig (PathCo adds its aggregation), so the
    loop they share reads the same fields with the same defaults and checks."""
    import dataclasses

    from inference.methods import pathco, stepco

    loop = [(f.name, f.default) for f in dataclasses.fields(stepco.RevisionConfig)]
    assert issubclass(stepco.Config, stepco.RevisionConfig) and issubclass(pathco.Config, stepco.RevisionConfig)
    # StepCo's step θ alone defaults to auto (None: calibrated by the harness); PathCo's path θ stays 0.5
    assert [(f.name, f.default) for f in dataclasses.fields(stepco.Config)] == [("threshold", None), *loop[1:]]
    assert [(f.name, f.default) for f in dataclasses.fields(pathco.Config)] == [*loop, ("aggregation", "mean")]
    for config in (stepco.Config, pathco.Config):
        with pytest.raises(ValueError, match="revision must be one of"):
            config(revision="rewrite")
