"""Self-consistency: sample several reasoning paths, answer with the most frequent final answer.

Wang et al. 2023, "Self-Consistency Improves Chain of Thought Reasoning in Language Models"; the
no-verifier baseline of StepCo (Wu et al. 2024, "Enhancing Mathematical Reasoning in LLMs by
Stepwise Correction"). Each problem gets `n` samples of `solve_prompt` at `temperature`; every
sample with an extracted answer casts one vote under its normalised answer key
(`inference.methods.base.answer_key`: "5", "5.0" and "$5" are one answer); samples without an
answer do not vote. A tie goes to the answer seen first, so the result is deterministic given the
samples. The prediction is the winning answer as its first sample wrote it, and the completion
is that sample. All problems' samples come from one generator call. The trace records each
sample's text, answer, finish reason and its own prompt and completion tokens, so that the
method at a smaller N can be read from the first N samples, tokens included.
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


@dataclass
class Config:
    n: int = 8
    """Samples per problem."""
    temperature: float = 0.8
    """Sampling temperature of every sample."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 192
    """Most tokens generated per sample."""
    seed: int = 0
    """Sampling seed passed to the generator."""

    def __post_init__(self) -> None:
        check_sampling_fields(self)


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_p=config.top_p, n=config.n, seed=config.seed)
    outputs = tracker.generate(list(range(len(problems))), [solve_prompt(p.question) for p in problems], params)
    results = []
    for i, (problem, completions) in enumerate(zip(problems, outputs)):
        flags: list[str] = []
        answers = []
        for c in completions:
            answer = extract_answer(c.text, problem.answer_kind)
            answers.append(answer)
            flags += completion_flags(c, split_steps(c.text), answer)
        winner, votes = majority_vote(answers, problem.answer_kind)
        if winner is None:
            flags.append("no_votes")
        results.append(
            MethodOutput(
                prediction=answers[winner] if winner is not None else None,
                completion=(completions[winner].text if winner is not None
                            else (completions[0].text if completions else "")),
                usage=tracker.usage[i],
                trace={"samples": [c.text for c in completions], "answers": answers,
                       "finish_reasons": [c.finish_reason for c in completions],
                       "prompt_tokens": [c.prompt_tokens for c in completions],
                       "completion_tokens": [c.completion_tokens for c in completions],
                       "votes": votes, "chosen": winner},
                flags=flags,
            )
        )
    return results
