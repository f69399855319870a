"""Best-of-N: sample N reasoning paths, answer with the one the verifier scores highest.

The verifier-reranking baseline of StepCo (Wu et al. 2024, "Enhancing Mathematical Reasoning in
LLMs by Stepwise Correction"), which ranks paths by a process-supervised verifier (PSV) as in
Lightman et al. 2023 ("Let's Verify Step by Step"). Each problem gets `n` samples of
`solve_prompt`; every path is scored step by step by the `Verifier` (all problems' paths in one
`score` call) and its step scores are reduced to one number by `aggregation`: `mean` (StepCo's
appendix default), `min`, `prod` or `last` (`reward_models.verifier.aggregate`, the one place the
aggregation is defined). The highest aggregate wins, the first sample on a tie.

A sample with no steps, or one the verifier refuses, cannot be scored: its score is None, it is
never chosen, and it is counted as an 'unscorable' flag. When no sample of a problem can be scored
the method falls back to a majority vote over the samples' answers (flag 'fallback_majority_vote').

Each sample of the trace records its own prompt, completion and verifier tokens, so that
Best-of-N at a smaller N can be read from the first N samples, tokens included.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import SamplingParams
from inference.methods.base import (
    MethodOutput,
    Tracker,
    check_sampling_fields,
    completion_flags,
    majority_vote,
)
from reasoning.answers import extract_answer
from reasoning.prompts import solve_prompt
from reasoning.steps import split_steps
from reasoning.types import Problem
from reward_models.verifier import AGGREGATIONS, aggregate


@dataclass
class Config:
    n: int = 8
    """Samples per problem."""
    temperature: float = 0.8
    """Sampling temperature of every sample."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    aggregation: str = "mean"
    """How a path's step scores become one score: mean (StepCo's default), min, prod or last."""
    max_new_tokens: int = 192
    """Most tokens generated per sample."""
    seed: int = 0
    """Sampling seed passed to the generator."""

    def __post_init__(self) -> None:
        check_sampling_fields(self)
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_p=config.top_p, n=config.n, seed=config.seed)
    outputs = tracker.generate(list(range(len(problems))), [solve_prompt(p.question) for p in problems], params)

    # Parse every sample, then score all scorable paths of all problems in one verifier call.
    parsed = []  # per problem: list of (path, answer)
    owners, questions, paths, where = [], [], [], []
    for i, (problem, completions) in enumerate(zip(problems, outputs)):
        rows = []
        for j, c in enumerate(completions):
            path = split_steps(c.text)
            rows.append((path, extract_answer(c.text, problem.answer_kind)))
            if path.steps:
                owners.append(i)
                questions.append(problem.question)
                paths.append(path.steps)
                where.append((i, j))
        parsed.append(rows)
    spent: list[int] = []
    step_scores: dict[tuple[int, int], list[float] | None] = dict(
        zip(where, tracker.score_paths(owners, questions, paths, tokens=spent))
    )
    verifier_tokens = dict(zip(where, spent))

    results = []
    for i, (problem, completions) in enumerate(zip(problems, outputs)):
        flags: list[str] = []
        samples = []
        best, best_score = None, None
        for j, (c, (path, answer)) in enumerate(zip(completions, parsed[i])):
            flags += completion_flags(c, path, answer)
            s = step_scores.get((i, j))
            value = aggregate(s, config.aggregation) if s else None
            if value is None:
                flags.append("unscorable")
            elif best_score is None or value > best_score:
                best, best_score = j, value
            samples.append({"text": c.text, "answer": answer, "finish_reason": c.finish_reason,
                            "step_scores": s, "score": value, "prompt_tokens": c.prompt_tokens,
                            "completion_tokens": c.completion_tokens,
                            "verifier_tokens": verifier_tokens.get((i, j), 0)})
        trace = {"samples": samples, "aggregation": config.aggregation, "chosen": best, "chosen_by": "verifier"}
        if best is None:
            best, votes = majority_vote([a for _, a in parsed[i]], problem.answer_kind)
            trace.update(chosen=best, chosen_by="majority_vote", votes=votes)
            flags.append("fallback_majority_vote")
            if best is None:
                flags.append("no_votes")
        results.append(
            MethodOutput(
                prediction=parsed[i][best][1] if best is not None else None,
                completion=completions[best].text if best is not None else (completions[0].text if completions else ""),
                usage=tracker.usage[i],
                trace=trace,
                flags=flags,
            )
        )
    return results
