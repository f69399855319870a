"""`mc` (Math-Shepherd): rollouts from every prefix of each sampled path; a step's label is the
fraction of its rollouts that reach the gold answer (`--hard`: whether any does; `--best_of K`: the
chance that one of K does, PAV's Best-of-K prover). Labels of a prefix's success probability under
the policy as a prover, so a PSV trained on them and paid in the delta form (`--reward step`'s
default) gives progress rewards without sampling a continuation during RL."""

from __future__ import annotations

from collections.abc import Sequence

from backends.base import SamplingParams
from reasoning.prompts import solve_prompt
from reasoning.stats import best_of_k
from reasoning.steps import answer_correct, has_answer, prefix_text
from reward_models.annotate.base import derive_seed, make_row
from reward_models.annotate.sampling import sample_paths


def mc_label(hits: Sequence[bool], hard: bool = False, best_of: int = 1) -> float:
    """Math-Shepherd's label of a prefix from its rollouts: fraction right (soft), any right (hard), or
    the chance that one of `best_of` continuations is right (`best_of_k`; 1 is the fraction)."""
    if not hits:
        raise ValueError("a Monte-Carlo label needs at least one rollout")
    if hard:
        return float(any(hits))
    return best_of_k(sum(map(bool, hits)), len(hits), best_of)


def annotate_group(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
    sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
    prefixes: dict[tuple[int, tuple[str, ...]], int] = {}
    for i, paths in enumerate(sampled):
        for path in paths:
            for end in range(1, len(path.steps)):
                prefixes.setdefault((i, tuple(path.steps[:end])), len(prefixes))
    keys = list(prefixes)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=cfg.rollouts,
                            seed=derive_seed(cfg.seed, "rollouts", group))
    prompts = [solve_prompt(problems[i].question, list(prefix)) for i, prefix in keys]
    outputs = stats.generate(generator, prompts, params)
    hits: dict[tuple[int, tuple[str, ...]], list[bool]] = {}
    for (i, prefix), completions in zip(keys, outputs):
        # the prefix counts too: a rollout from a prefix that already answered may not repeat it
        done_text = prefix_text(list(prefix))
        hits[(i, prefix)] = [answer_correct(done_text + c.text, problems[i], cfg.answer_match)
                            for c in completions]
        stats.count("rollout_no_answer", sum(not has_answer(done_text + c.text) for c in completions))
        stats.count("rollout_truncated", sum(c.finish_reason == "length" for c in completions))
    out = {}
    for i, (problem, paths) in enumerate(zip(problems, sampled)):
        rows = []
        for k, path in enumerate(paths):
            labels = [mc_label(hits[(i, tuple(path.steps[:end]))], cfg.hard, cfg.best_of)
                      for end in range(1, len(path.steps))]
            rows.append(make_row(problem, "mc", k, path.steps, labels + [float(path.correct)], path.correct))
        out[problem.id] = rows
    return out
