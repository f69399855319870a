"""Full paths sampled from the policy, and methods that label each sampled path without rollouts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from backends.base import Generator, SamplingParams
from reasoning.prompts import solve_prompt
from reasoning.steps import answer_correct, has_answer, split_steps
from reasoning.types import Problem
from reward_models.annotate.base import AnnotateConfig, GroupAnnotator, RunStats, derive_seed, make_row


@dataclass
class SampledPath:
    steps: list[str]
    correct: bool
    answered: bool
    truncated: bool


def sample_paths(
    generator: Generator, problems: Sequence[Problem], cfg: AnnotateConfig, seed: int, stats: RunStats
) -> list[list[SampledPath]]:
    """`paths_per_problem` full paths per problem; paths with no step are counted and dropped."""
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                            n=cfg.paths_per_problem, seed=seed)
    outputs = stats.generate(generator, [solve_prompt(p.question) for p in problems], params)
    result = []
    for problem, completions in zip(problems, outputs):
        paths = []
        for c in completions:
            steps = split_steps(c.text).steps
            truncated = c.finish_reason == "length"
            answered = has_answer(c.text)
            stats.count("path_truncated", truncated)
            stats.count("path_no_answer", not answered)
            if not steps:
                stats.count("path_no_steps")
                continue
            paths.append(SampledPath(steps, answer_correct(c.text, problem, cfg.answer_match), answered, truncated))
        result.append(paths)
    return result


def labelled_samples(method: str, label: Callable[[Problem, SampledPath], list[float]]) -> GroupAnnotator:
    """A method that labels each sampled path (no rollout) with `label(problem, path)`."""

    def annotate_samples(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
        sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
        return {
            problem.id: [make_row(problem, method, k, p.steps, label(problem, p), p.correct)
                         for k, p in enumerate(paths)]
            for problem, paths in zip(problems, sampled)
        }

    return annotate_samples
