"""Greedy chain of thought with step tags: the baseline every other method is measured against.

One greedy completion of `reasoning.prompts.solve_prompt` per problem (the `<Step>...</Step>`
format of StepCo, Wu et al. 2024, "Enhancing Mathematical Reasoning in LLMs by Stepwise
Correction", which is also the format our policies are trained on); the prediction is the final
answer extracted from it. Chain-of-thought prompting as in Wei et al. 2022, decoded greedily.
All problems go to the generator in one call; no verifier is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.base import SamplingParams
from inference.methods.base import MethodOutput, Tracker, check_sampling_fields, completion_flags
from reasoning.answers import extract_answer
from reasoning.prompts import solve_prompt
from reasoning.steps import split_steps
from reasoning.types import Problem


@dataclass
class Config:
    max_new_tokens: int = 192
    """Most tokens generated for a solution."""
    seed: int = 0
    """Passed to the generator (greedy decoding does not use it)."""

    def __post_init__(self) -> None:
        check_sampling_fields(self)


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=0.0, n=1, seed=config.seed)
    outputs = tracker.generate(list(range(len(problems))), [solve_prompt(p.question) for p in problems], params)
    results = []
    for i, (problem, completions) in enumerate(zip(problems, outputs)):
        completion = completions[0]
        path = split_steps(completion.text)
        answer = extract_answer(completion.text, problem.answer_kind)
        results.append(
            MethodOutput(
                prediction=answer,
                completion=completion.text,
                usage=tracker.usage[i],
                trace={"steps": path.steps, "finish_reason": completion.finish_reason,
                       "segmentation": path.segmentation},
                flags=completion_flags(completion, path, answer),
            )
        )
    return results
