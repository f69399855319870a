"""BEATS tree search: pruning rules, batching, back-verification, the vote, flags, accounting."""

import json
import re
from collections import Counter

import pytest

from backends.base import Completion, SamplingParams
from inference.methods import beats
from inference.methods.base import Tracker, blind
from reasoning.prompts import final_answer_prompt
from reasoning.types import Problem

FINAL_TAIL = "<Step> The answer is <ans>"
PROBLEMS = [
    Problem(id="a", question="Ann has 2 cats. Ann is 30 years old. How many cats does Ann have?", answer=""),
    Problem(id="b", question="Bob has 7 pens. Bob buys 3 more pens. How many pens does Bob have now?", answer=""),
]


def question_of(prompt: str) -> str:
    return prompt.split("\n", 1)[0].removeprefix("Question: ").removeprefix("Clarified: ")


def n_steps(prompt: str) -> int:
    return prompt.count("</Step>")


class Scripted:
    """A deterministic fake generator: canned completions chosen by the kind of prompt.

    Subclasses override `clarify`, `forward`, `final` and `verify` (each returns the text, or
    (text, finish_reason)). Token counts are characters, so accounting can be checked exactly.
    """

    def __init__(self):
        self.calls: list[tuple[list[str], SamplingParams]] = []
        self.texts: list[list[str]] = []  # the completions of each call, one per prompt (n is 1)
        self.sample = 0

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        out = []
        for prompt in prompts:
            row = []
            for _ in range(params.n):
                result = self.respond(prompt, params)
                text, reason = result if isinstance(result, tuple) else (result, "stop")
                row.append(Completion(text, len(prompt), len(text), reason))
            out.append(row)
        self.texts.append([row[0].text for row in out])
        return out

    def respond(self, prompt, params):
        if "Rewrite the question without irrelevant sentences." in prompt:
            return self.clarify(prompt)
        if "Check the proposed answer." in prompt:
            answer = re.search(r"Proposed answer: (.*)\n", prompt).group(1)
            return self.verify(question_of(prompt), answer)
        if prompt.endswith(FINAL_TAIL):
            return self.final(prompt)
        assert prompt.endswith("Answer:\n") or prompt.endswith("</Step>\n"), prompt
        self.sample += 1
        return self.forward(prompt)

    def clarify(self, prompt):
        return " Clarified: " + question_of(prompt) + "\n"

    def forward(self, prompt):
        return f"<Step> step {n_steps(prompt) + 1} sample {self.sample}.</Step>"

    def final(self, prompt):
        return f"{n_steps(prompt)}</ans>.</Step>"

    def verify(self, question, answer):
        return "<Step> re-solved.</Step>\nVerdict: " + ("correct" if answer == "3" else "incorrect")


def run(generator, config=None, problems=PROBLEMS, verifier=None):
    tracker = Tracker(generator, verifier, len(problems))
    return beats.run(list(problems), tracker, config or beats.Config()), tracker


def tree_calls(gen):
    return [(prompts, params) for prompts, params in gen.calls
            if not any("Rewrite the question" in p or "Check the proposed answer." in p for p in prompts)]


# ----------------------------------------------------------------------------------------------
# the tree


def test_clarify_only_at_the_root_and_clarified_branch_uses_it():
    gen = Scripted()
    outputs, _ = run(gen)
    clarify_calls = [i for i, (prompts, _) in enumerate(gen.calls) if any("Rewrite the question" in p for p in prompts)]
    assert clarify_calls == [0]
    assert len(gen.calls[0][0]) == len(PROBLEMS)  # one clarify action per problem, nothing else in that call
    assert gen.calls[0][1].stop == ("\n",) and gen.calls[0][1].temperature == 0
    for out, p in zip(outputs, PROBLEMS):
        assert out.trace["clarify"] == "clarified"
        assert out.trace["clarified_question"] == "Clarified: " + p.question
        kinds = {c["clarified"] for c in out.trace["candidates"]}
        assert kinds == {True, False}
    # the clarified branch's prompts carry the clarified question; verification the original one
    tree_prompts = [p for prompts, _ in tree_calls(gen) for p in prompts]
    assert any(p.startswith("Question: Clarified: ") for p in tree_prompts)
    verify_prompts = [p for p in gen.calls[-1][0]]
    assert all("Check the proposed answer." in p and "Clarified" not in p for p in verify_prompts)


def test_a_clarification_that_is_not_a_question_adds_no_branch():
    class Solves(Scripted):
        def clarify(self, prompt):
            return " <Step> 2 + 3 = 5.</Step>\n" if "Ann" in prompt else " " + question_of(prompt) + "\n"

    outputs, _ = run(Solves(), beats.Config(width=0))
    assert outputs[0].trace["clarify"] == "malformed" and outputs[0].flags.count("clarify_malformed") == 1
    assert outputs[1].trace["clarify"] == "unchanged" and not outputs[1].flags
    for out in outputs:
        assert not any(c["clarified"] for c in out.trace["candidates"])


def test_forward_step_and_depth_limits():
    gen = Scripted()
    outputs, _ = run(gen, beats.Config(width=0))
    for prompts, params in tree_calls(gen):
        assert params.stop == ("</Step>",)
        for p in prompts:
            if p.endswith(FINAL_TAIL):
                assert n_steps(p) <= 5
            else:
                assert n_steps(p) < 5  # a forward action never makes a sixth step
    for out in outputs:
        cands = out.trace["candidates"]
        assert all(c["forward_steps"] <= 5 and c["depth"] <= 7 for c in cands)
        assert max(c["depth"] for c in cands if c["clarified"]) == 7  # clarify + 5 steps + answer
        assert max(c["depth"] for c in cands if not c["clarified"]) == 6
        # every node answers: per branch, 2^k paths of k forward steps, k = 0..5
        per_branch = Counter((c["clarified"], c["forward_steps"]) for c in cands)
        assert per_branch == {(b, k): 2**k for b in (True, False) for k in range(6)}

    gen = Scripted()
    outputs, _ = run(gen, beats.Config(max_depth=4, width=0))
    for out in outputs:
        cands = out.trace["candidates"]
        assert max(c["depth"] for c in cands) == 4
        assert max(c["forward_steps"] for c in cands if c["clarified"]) == 2
        assert max(c["forward_steps"] for c in cands if not c["clarified"]) == 3

    gen = Scripted()
    outputs, _ = run(gen, beats.Config(max_forward_steps=2, answer_at_every_node=False, clarify=False, width=0))
    cands = outputs[0].trace["candidates"]
    assert {c["forward_steps"] for c in cands} == {2} and len(cands) == 4
    assert not any("Rewrite the question" in p for prompts, _ in gen.calls for p in prompts)


def test_one_generate_call_per_level_for_all_problems():
    gen = Scripted()
    outputs, tracker = run(gen, beats.Config(width=0))
    # clarify, six expansion rounds (root branch depths 0-5 alongside clarified depths 1-6), verify
    assert len(gen.calls) == 1 + 6 + 1
    for prompts, params in tree_calls(gen):
        owners = {question_of(p).removeprefix("Clarified: ") for p in prompts}
        assert owners == {p.question for p in PROBLEMS}  # every call serves both problems
        assert params.n == 1 and params.temperature == 0.7
    seeds = [params.seed for _, params in tree_calls(gen)]
    assert len(set(seeds)) == len(seeds)  # each round samples with its own seed
    assert all(o.trace["rounds"] == 6 for o in outputs)
    gen_deep = Scripted()
    run(gen_deep, beats.Config(width=2, max_forward_steps=10))  # the depth limit binds, not the step limit
    assert len(gen_deep.calls) == 1 + 7 + 1
    total_generations = sum(len(prompts) for prompts, _ in gen.calls)
    assert sum(o.trace["generations"] for o in outputs) == total_generations
    assert sum(u.llm_calls for u in tracker.usage) == total_generations


def test_candidates_come_only_from_final_answer_leaves():
    class AnswersEarly(Scripted):
        def forward(self, prompt):
            if n_steps(prompt) == 1:  # the second step states the answer
                return f"<Step> So the answer is <ans>{40 + self.sample}</ans>.</Step>"
            return super().forward(prompt)

    gen = AnswersEarly()
    outputs, _ = run(gen, beats.Config(width=0, clarify=False))
    cands = outputs[0].trace["candidates"]
    assert {c["action"] for c in cands} == {"final_answer", "answer_in_step"}
    for c in cands:
        assert "<ans>" in c["steps"][-1] and c["answer"] in c["steps"][-1]
        if c["action"] == "final_answer":
            assert c["steps"][-1].startswith("The answer is <ans>")
    # an answer-stating step is a leaf: nothing is generated below it
    tree_prompts = [p for prompts, _ in tree_calls(gen) for p in prompts]
    assert not any("So the answer is" in p for p in tree_prompts)
    assert max(c["forward_steps"] for c in cands) == 2
    # no candidate from an intermediate (non-final) node
    final_prompts = [p for p in tree_prompts if p.endswith(FINAL_TAIL)]
    n_final = sum(1 for c in cands if c["action"] == "final_answer")
    assert n_final == len(final_prompts) // len(PROBLEMS)

    gen = AnswersEarly()
    outputs, _ = run(gen, beats.Config(width=0, clarify=False, answer_in_step_is_leaf=False))
    assert {c["action"] for c in outputs[0].trace["candidates"]} == {"final_answer"}
    assert outputs[0].trace["pruned_answer_in_step"] == 4


def test_identical_children_are_merged_and_width_limits_a_level():
    class SameStep(Scripted):
        def forward(self, prompt):
            return f"<Step> step {n_steps(prompt) + 1}.</Step>"

    gen = SameStep()
    outputs, _ = run(gen, beats.Config(clarify=False))
    out = outputs[0]
    assert out.trace["duplicates_merged"] == 5  # the second sample at each of the five levels
    assert len(out.trace["candidates"]) == 6  # a single chain: answers after 0..5 steps

    gen = SameStep()
    run(gen, beats.Config(clarify=False, temperature=0.0, branching=4))
    forward_per_call = [sum(not p.endswith(FINAL_TAIL) for p in prompts) for prompts, _ in tree_calls(gen)]
    assert max(forward_per_call) == len(PROBLEMS)  # greedy: one forward sample per node

    gen = Scripted()
    outputs, _ = run(gen, beats.Config(width=3))
    for prompts, _ in tree_calls(gen):
        for p in PROBLEMS:
            mine = [q for q in prompts if p.question in q and not q.endswith(FINAL_TAIL)]
            assert len(mine) <= 3 * 2  # width nodes x branching samples
    assert outputs[0].trace["pruned_width"] > 0
    # the width cut keeps both branches alive to the bottom
    cands = outputs[0].trace["candidates"]
    assert {c["forward_steps"] for c in cands if c["clarified"]} == set(range(6))
    assert {c["forward_steps"] for c in cands if not c["clarified"]} == set(range(6))


# ----------------------------------------------------------------------------------------------
# back-verification and the vote


class Voting(Scripted):
    """Final answers: mostly "7" (wrong), some "3" / "3.0" (right) depending on the step count."""

    def final(self, prompt):
        k = n_steps(prompt)
        return {0: "3</ans>.</Step>", 1: "3.0</ans>.</Step>"}.get(k, "7</ans>.</Step>")


def test_back_verification_once_per_distinct_answer_and_vote_over_verified():
    gen = Voting()
    outputs, _ = run(gen, beats.Config(width=0))
    verify_prompts = gen.calls[-1][0]
    assert all("Check the proposed answer." in p for p in verify_prompts)
    # per problem, "3" and "3.0" are one answer: two verifications ("3" and "7"), not one per leaf
    assert len(verify_prompts) == 2 * len(PROBLEMS)
    for out in outputs:
        votes_all = Counter(c["answer"] for c in out.trace["candidates"])
        assert votes_all.most_common(1)[0][0] == "7"  # plain majority would pick the wrong answer
        assert out.prediction == "3"
        assert out.trace["vote_pool"] == "verified" and out.trace["fallback"] is False
        assert out.trace["votes"] == {"3": 6}  # per branch: 1 leaf "3" (0 steps) + 2 leaves "3.0" (1 step)
        assert {v["answer"]: v["verdict"] for v in out.trace["verifications"]} == {"3": True, "7": False}
        for c in out.trace["candidates"]:
            assert c["verified"] == (c["answer"] in ("3", "3.0"))
        assert "no_verified_candidate" not in out.flags
        assert out.completion.rstrip().endswith("3</ans>.</Step>")


def test_fallback_to_all_candidates_when_none_verifies():
    class NothingVerifies(Voting):
        def verify(self, question, answer):
            return "<Step> hmm.</Step>\nVerdict: incorrect"

    outputs, _ = run(NothingVerifies(), beats.Config(width=0))
    for out in outputs:
        assert out.prediction == "7"
        assert out.trace["fallback"] is True and out.trace["vote_pool"] == "all (none verified)"
        assert out.flags.count("no_verified_candidate") == 1

    outputs, _ = run(Voting(), beats.Config(width=0, llm_backverify=False))
    assert outputs[0].prediction == "7" and outputs[0].trace["vote_pool"] == "all (no back-verification)"


def test_no_gold_answer_is_used():
    with_gold = [Problem(id=p.id, question=p.question, answer="3", meta={"steps": ["x"]}) for p in PROBLEMS]
    wrong_gold = [Problem(id=p.id, question=p.question, answer="999") for p in PROBLEMS]
    a, _ = run(Voting(), beats.Config(width=4), problems=blind(with_gold))
    b, _ = run(Voting(), beats.Config(width=4), problems=wrong_gold)
    c, _ = run(Voting(), beats.Config(width=4), problems=PROBLEMS)  # answer=""
    assert [o.prediction for o in a] == [o.prediction for o in b] == [o.prediction for o in c] == ["3", "3"]
    assert [o.trace for o in a] == [o.trace for o in b] == [o.trace for o in c]


def test_token_attribution_per_problem():
    class ShortForA(Scripted):
        def forward(self, prompt):
            if "Ann" in prompt and n_steps(prompt) == 0:
                return f"<Step> The answer is <ans>{self.sample}</ans>.</Step>"
            return super().forward(prompt)

    gen = ShortForA()
    outputs, tracker = run(gen, beats.Config(width=0))
    expected = [Counter(), Counter()]
    for (prompts, params), texts in zip(gen.calls, gen.texts):
        assert params.n == 1
        for p, text in zip(prompts, texts):
            i = 0 if "Ann" in p else 1
            expected[i]["prompt"] += len(p)
            expected[i]["completion"] += len(text)
            expected[i]["calls"] += 1
    for i, out in enumerate(outputs):
        assert out.usage is tracker.usage[i]
        assert out.usage.prompt_tokens == expected[i]["prompt"]
        assert out.usage.completion_tokens == expected[i]["completion"]
        assert out.usage.llm_calls == expected[i]["calls"] == out.trace["generations"]
    assert outputs[0].usage.total_tokens < outputs[1].usage.total_tokens / 5  # A's tree stops early


# ----------------------------------------------------------------------------------------------
# robustness


def test_bad_outputs_are_flagged_and_never_crash():
    class Messy(Scripted):
        def clarify(self, prompt):
            return ("Clarified: a question that never ends", "length") if "Ann" in prompt else "   \n"

        def forward(self, prompt):
            k = self.sample % 5
            if k == 0:
                return ("<Step> a step cut sh", "length")
            if k == 1:
                return ""
            if k == 2:
                return "<Step> a step the model never closed."
            if k == 3:
                return "plain text without tags"
            return super().forward(prompt)

        def final(self, prompt):
            k = n_steps(prompt) % 4
            if k == 0:
                return "5</ans>.</Step>"
            if k == 1:
                return ("5 and then it goes on and on", "length")
            if k == 2:
                return "no number here</ans>.</Step>"
            return "6"  # no closing tags

        def verify(self, question, answer):
            return ("<Step> thinking forever", "length") if answer == "5" else "I am not sure."

    outputs, _ = run(Messy(), beats.Config(width=0))
    everything = Counter(flag for out in outputs for flag in out.flags)
    for name in ("truncated", "empty_output", "unclosed_tags", "no_tags", "no_answer", "no_verdict"):
        assert everything[name] >= 1, name
    for out in outputs:
        assert out.trace["anomalies"] == dict(Counter(out.flags))
        assert out.flags.count("no_verified_candidate") == 1
        assert out.prediction in ("5", "6")
        assert out.trace["clarify"] in ("truncated", "empty")
        assert not any(c["clarified"] for c in out.trace["candidates"])
    assert "clarify_truncated" in outputs[0].flags and "clarify_empty" in outputs[1].flags


def test_a_tree_without_candidates_predicts_none():
    class Silent(Scripted):
        def forward(self, prompt):
            return ""

        def final(self, prompt):
            return ("", "length")

    gen = Silent()
    outputs, _ = run(gen)
    for out in outputs:
        assert out.prediction is None and out.completion == ""
        assert "no_candidates" in out.flags and out.trace["candidates"] == []
    assert not any("Check the proposed answer." in p for prompts, _ in gen.calls for p in prompts)
    assert beats.run([], Tracker(gen, None, 0), beats.Config()) == []


# ----------------------------------------------------------------------------------------------
# the step verifier as back-verifier


class FakeVerifier:
    """Scores 0.9 per step on paths ending in answer 3, else 0.2; reads 1 token per character."""

    def __init__(self):
        self.tokens_used = 0
        self.batches = []

    def score(self, questions, paths):
        self.batches.append(len(paths))
        out = []
        for q, steps in zip(questions, paths):
            self.tokens_used += len(q) + sum(len(s) for s in steps)
            good = re.search(r"<ans>3(\.0)?</ans>", steps[-1]) is not None
            out.append([0.9 if good else 0.2] * len(steps))
        return out


def test_verifier_backverify_alone_and_with_the_llm():
    gen, verifier = Voting(), FakeVerifier()
    outputs, tracker = run(gen, beats.Config(width=0, llm_backverify=False, verifier_backverify=True),
                           verifier=verifier)
    # one call, one score per distinct path of a problem (the answer-only path of both branches is one)
    distinct = sum(len({tuple(c["steps"]) for c in o.trace["candidates"]}) for o in outputs)
    assert verifier.batches == [distinct] and distinct == sum(len(o.trace["candidates"]) for o in outputs) - 2
    assert not any("Check the proposed answer." in p for prompts, _ in gen.calls for p in prompts)
    for i, out in enumerate(outputs):
        assert out.prediction == "3"
        assert all(c["verifier_score"] in (0.9, 0.2) and c["llm_verdict"] is None for c in out.trace["candidates"])
        assert tracker.usage[i].verifier_calls == len(out.trace["candidates"]) - 1
        assert tracker.usage[i].verifier_tokens > 0
    assert sum(u.verifier_tokens for u in tracker.usage) == verifier.tokens_used

    class LLMSaysSeven(Voting):
        def verify(self, question, answer):
            return "Verdict: correct" if answer == "7" else "Verdict: incorrect"

    outputs, _ = run(LLMSaysSeven(), beats.Config(width=0, verifier_backverify=True), verifier=FakeVerifier())
    # both checks must pass: none does, so the vote falls back to all leaves
    assert all(o.trace["fallback"] and o.prediction == "7" for o in outputs)

    with pytest.raises(ValueError, match="verifier"):
        run(Voting(), beats.Config(verifier_backverify=True))


def test_config_validation():
    with pytest.raises(ValueError):
        beats.Config(max_depth=0)
    with pytest.raises(ValueError):
        beats.Config(width=-1)
    with pytest.raises(ValueError):
        beats.Config(verifier_aggregate="median")
    with pytest.raises(ValueError):
        beats.Config(temperature=-0.1)


def test_config_parses_from_the_command_line():
    from transformers import HfArgumentParser

    (config,) = HfArgumentParser(beats.Config).parse_args_into_dataclasses(
        args=["--width", "3", "--verifier_backverify", "true", "--clarify", "false"])
    assert config.width == 3 and config.verifier_backverify is True and config.clarify is False


def test_final_answer_prompt_tail_matches():
    assert final_answer_prompt("q", ["a"]).endswith(FINAL_TAIL)
    assert beats.FINAL_OPENING == FINAL_TAIL


# ----------------------------------------------------------------------------------------------
# end to end with a real tiny model


def test_tiny_hf_model_end_to_end():
    import torch

    from backends.hf import HFGenerator
    from reasoning.corpora import build_corpus
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate, row_to_problem
    from rl.models import build_tiny_causal_lm

    torch.set_num_threads(1)
    world = WorldConfig(min_steps=1, max_steps=2)
    rows = generate("train", 60, 0, world)
    corpus = build_corpus(rows, {"solve": 1, "clarify": 1, "verify": 1}, seed=0)
    tok = train_tokenizer([r["prompt"] + r["completion"] for r in corpus], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).eval()
    generator = HFGenerator(model, tok, batch_size=64)
    problems = [row_to_problem(r) for r in generate("test", 2, 0, world)]
    config = beats.Config(max_new_tokens=6, clarify_max_new_tokens=8, verify_max_new_tokens=6, max_depth=4,
                          max_forward_steps=2, branching=2, width=2)
    tracker = Tracker(generator, None, len(problems))
    outputs = beats.run(blind(problems), tracker, config)
    assert len(outputs) == 2
    for out, usage in zip(outputs, tracker.usage):
        assert out.usage is usage and usage.llm_calls == out.trace["generations"] > 0
        assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
        assert out.trace["clarify"] in ("clarified", "unchanged", "empty", "truncated")
        assert out.trace["nodes_expanded"] >= 1
        assert out.prediction is None or isinstance(out.prediction, str)
        assert all(c["depth"] <= 4 and c["forward_steps"] <= 2 for c in out.trace["candidates"])
        if out.prediction is None:
            assert "no_candidates" in out.flags
        json.dumps(out.trace)  # the harness writes traces to JSONL
