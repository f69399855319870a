"""What every inference method shares: the call shape, per-problem compute accounting, the output row.

Every method is one module in `inference/methods/` with

- a `Config` dataclass (one docstring per field; `seed` and `max_new_tokens` among them), and
- `run(problems, tracker, config) -> list[MethodOutput]`, one output per problem, in order.

Methods batch their generation and scoring across problems for speed, and call the generator and
the verifier only through the `Tracker`, which attributes every prompt token, completion token,
LLM call and verifier token to the problem it was spent on. Gold answers are never passed to a
method: `Problem.answer` is hidden by `blind()` before `run` sees the problems.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import Completion, Generator, SamplingParams
from backends.prompt_limits import PROMPT_TOO_LONG, prompts_fit
from reasoning.answers import choice_letter, parse_number
from reasoning.grading import normalize_latex, normalize_text
from reasoning.types import Problem, ReasoningPath
from reward_models.scoring import score_paths
from reward_models.verifier import Verifier, layout


@dataclass
class Usage:
    """Compute spent on one problem."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    """Completions requested from the generator (n samples of one prompt count n)."""
    verifier_tokens: int = 0
    verifier_calls: int = 0
    """Paths scored by the verifier."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens + self.verifier_tokens

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "total_tokens": self.total_tokens}


@dataclass
class MethodOutput:
    prediction: str | None
    """The method's final answer (extracted), None when it found none."""
    completion: str
    """The text the prediction comes from (the chosen or final path)."""
    usage: Usage
    trace: dict[str, Any] = field(default_factory=dict)
    """Method-specific record: samples and votes, per-round scores, tree statistics..."""
    flags: list[str] = field(default_factory=list)
    """Counted anomalies: 'no_answer', 'no_steps', 'truncated', 'unclosed_tags', ..."""


class NoVerifierError(ValueError):
    """A method that needs a verifier was run without one."""


class Tracker:
    """The generator and verifier as methods see them, with per-problem accounting.

    `owners[i]` names the problem (its index in the batch given to `run`) that prompt or path `i`
    is spent on. Verifier tokens of one batched `score` call are split over its paths in
    proportion to the characters each path's text has; the total is exact. `last_path_tokens`
    holds each path's share of the latest `score` call, so that a method can record the tokens of
    each sample or round in its trace (a completion's own tokens are on the `Completion`).

    The context check: a generator that states its `context_length` (and counts tokens with
    `count_tokens`) never gets a prompt that cannot fit with `max_new_tokens` new tokens; such a
    prompt is not run, its problem gets the flag `prompt_too_long` (`flags`), and the method sees
    empty completions with finish reason `prompt_too_long`. `max_new_tokens` itself is capped to
    the context minus one (`capped_to` records it).
    """

    def __init__(self, generator: Generator, verifier: Verifier | None, n_problems: int):
        self.generator = generator
        self.verifier = verifier
        self.usage = [Usage() for _ in range(n_problems)]
        self.last_path_tokens: list[int] = []
        self.flags: list[list[str]] = [[] for _ in range(n_problems)]
        """Per problem: what the tracker itself refused to run (`prompt_too_long`)."""
        self.capped_to: int | None = None
        """The `max_new_tokens` a call was capped to, when one asked for more than the context."""

    def generate(self, owners: Sequence[int], prompts: Sequence[str], params: SamplingParams) -> list[list[Completion]]:
        if len(owners) != len(prompts):
            raise ValueError(f"{len(owners)} owners for {len(prompts)} prompts")
        if not prompts:
            return []
        fits, params = self._fit(prompts, params)
        sent = [p for p, ok in zip(prompts, fits) if ok]
        answers = iter(self.generator.generate(sent, params) if sent else [])
        refused = [Completion("", 0, 0, PROMPT_TOO_LONG) for _ in range(params.n)]
        outputs = [next(answers) if ok else list(refused) for ok in fits]
        for owner, ok in zip(owners, fits):
            if not ok and PROMPT_TOO_LONG not in self.flags[owner]:
                self.flags[owner].append(PROMPT_TOO_LONG)
        for owner, completions, ok in zip(owners, outputs, fits):
            u = self.usage[owner]
            u.llm_calls += len(completions) if ok else 0
            for c in completions:
                u.prompt_tokens += c.prompt_tokens
                u.completion_tokens += c.completion_tokens
        return outputs

    def _fit(self, prompts: Sequence[str], params: SamplingParams) -> tuple[list[bool], SamplingParams]:
        """Which prompts fit the generator's context with `params.max_new_tokens` (capped to the
        context minus one) new tokens; all of them when the generator states no context. A prompt
        too long in characters to fit is refused untokenised (`prompt_limits.prompts_fit`)."""
        context = getattr(self.generator, "context_length", None)
        count_tokens = getattr(self.generator, "count_tokens", None)
        if not context or count_tokens is None:
            return [True] * len(prompts), params
        if params.max_new_tokens > context - 1:
            params = dataclasses.replace(params, max_new_tokens=max(1, context - 1))
            self.capped_to = params.max_new_tokens
        fits = prompts_fit(prompts, context, params.max_new_tokens, count_tokens,
                           getattr(self.generator, "max_token_chars", None))
        return fits, params

    def score(self, owners: Sequence[int], questions: Sequence[str],
              paths: Sequence[Sequence[str]]) -> list[list[float]]:
        """The verifier's step scores of every path, charged to their owners; raises what the
        verifier raises (`score_paths` counts the unscorable paths instead)."""
        if self.verifier is None:
            raise NoVerifierError("this method needs a verifier; pass --verifier")
        if not (len(owners) == len(questions) == len(paths)):
            raise ValueError("owners, questions and paths must have the same length")
        if not paths:
            return []
        before = self.verifier.tokens_used
        scores = self.verifier.score(list(questions), [list(p) for p in paths])
        spent = self.verifier.tokens_used - before
        sizes = [len(layout(q, p).text) for q, p in zip(questions, paths)]
        total = sum(sizes) or 1
        assigned = 0
        self.last_path_tokens = []
        for k, (owner, size) in enumerate(zip(owners, sizes)):
            share = spent - assigned if k == len(sizes) - 1 else round(spent * size / total)
            assigned += share
            self.usage[owner].verifier_tokens += share
            self.usage[owner].verifier_calls += 1
            self.last_path_tokens.append(share)
        return scores

    def score_paths(self, owners: Sequence[int], questions: Sequence[str], paths: Sequence[Sequence[str]],
                    tokens: list[int] | None = None) -> list[list[float] | None]:
        """`score`, except that a path the verifier cannot score gets None instead of failing the
        batch (`reward_models.scoring.score_paths`: such a path is never sent, or is found by
        scoring a refused batch path by path); the caller flags it. `tokens`, when given, becomes
        the verifier tokens charged to each path (0 for one not scored)."""
        charged = [0] * len(paths)

        def score_batch(idx: list[int]) -> list[list[float]]:
            got = self.score([owners[i] for i in idx], [questions[i] for i in idx], [paths[i] for i in idx])
            for i, spent in zip(idx, self.last_path_tokens):
                charged[i] = spent
            return got

        scored = score_paths(self.verifier, questions, paths, score_batch=score_batch)
        if tokens is not None:
            tokens[:] = charged
        return scored.scores


SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "n")


def check_sampling_fields(config: Any) -> None:
    """A method Config's sampling fields (those of `SAMPLING_FIELDS` it has) checked as
    `SamplingParams` checks them, so a bad value (`n=0`, `max_new_tokens=-5`) is refused when the
    Config is made, before any model is loaded, with a ValueError naming the field."""
    for name in SAMPLING_FIELDS:
        if hasattr(config, name):
            SamplingParams(**{name: getattr(config, name)})


def blind(problems: Sequence[Problem]) -> list[Problem]:
    """Copies of the problems with the gold answer and every other source field (gold steps, the
    world's quantities) removed, so no method can read them; the question and options stay."""
    return [dataclasses.replace(p, answer="", meta={}) for p in problems]


# ----------------------------------------------------------------------------------------------
# Helpers shared by several methods: anomaly flags of one generation and answer voting.


def completion_flags(completion: Completion, path: ReasoningPath, answer: str | None) -> list[str]:
    """The anomalies of one generation, one flag each (a method appends them for every generation
    it makes, so `Counter(output.flags)` counts them):

    'truncated' (hit max_new_tokens), 'empty_output', 'no_steps', 'unclosed_tags' (the last
    `<Step>` never closed), 'no_tags' (steps found by blank lines or lines, not tags),
    'no_answer' (no final answer could be extracted).
    """
    flags = []
    if completion.finish_reason == "length":
        flags.append("truncated")
    if path.segmentation == "empty":
        flags.append("empty_output")
    if not path.steps:
        flags.append("no_steps")
    if path.segmentation == "unclosed_tags":
        flags.append("unclosed_tags")
    elif path.segmentation in ("blank_lines", "lines", "whole"):
        flags.append("no_tags")
    if answer is None:
        flags.append("no_answer")
    return flags


def answer_key(answer: str | None, kind: str = "number") -> str | None:
    """The key under which an extracted answer votes: equal keys are the same answer.

    An option letter for `choice`; otherwise the exact value when the answer is one number
    (so "5", "5.0", "$5" and "10/2" vote together, as does a LaTeX "\\frac{1}{2}" with "0.5");
    otherwise the normalised text (`normalize_latex` for `latex`, `normalize_text` for the rest).
    None for no answer (it does not vote).
    """
    if answer is None or not answer.strip():
        return None
    if kind == "choice":
        letter = choice_letter(answer)
        if letter is not None:
            return f"choice:{letter}"
    parsed = parse_number(answer)
    if parsed is not None:
        return f"number:{parsed[0]}"
    text = normalize_latex(answer) if kind == "latex" else normalize_text(answer)
    return f"text:{text}" if text else None


def majority_vote(answers: Sequence[str | None], kind: str = "number") -> tuple[int | None, dict[str, int]]:
    """(index of the winning sample, votes per answer key), samples without an answer not voting.

    The winner is the key with the most votes, a tie going to the key seen first; the index is
    that key's first sample. (None, {}) when no sample has an answer.
    """
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        key = answer_key(answer, kind)
        if key is None:
            continue
        votes[key] = votes.get(key, 0) + 1
        first.setdefault(key, i)
    if not votes:
        return None, {}
    best = max(votes, key=lambda k: (votes[k], -first[k]))
    return first[best], votes
