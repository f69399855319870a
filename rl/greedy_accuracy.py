"""Greedy accuracy of a policy on problems, used before and after training (SFT, PPO)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from backends.base import SamplingParams
from reasoning.grading import grade
from reasoning.prompts import solve_prompt
from reasoning.stats import paired_bootstrap_diff
from reasoning.steps import split_steps
from reasoning.types import Problem
from rl.problem_hooks import WORLD_HOOKS, ProblemHooks


def greedy_eval(generator, problems: list[Problem], max_new_tokens: int = 192,
                hooks: ProblemHooks = WORLD_HOOKS) -> dict[str, Any]:
    """Accuracy of greedy decoding, with per-problem rows and, on problems `hooks` classifies (the
    world's), each row's error kind and the error mix."""
    rows = greedy_rows(generator, problems, max_new_tokens, hooks)
    return {"summary": summarize_greedy_rows(rows), "rows": rows}


def greedy_rows(generator, problems: list[Problem], max_new_tokens: int = 192,
                hooks: ProblemHooks = WORLD_HOOKS) -> list[dict[str, Any]]:
    """One row per problem of greedy decoding: prediction, correctness, completion, finish reason,
    tokens and, on problems `hooks` classifies, the error kind."""
    if not problems:
        return []
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    outputs = generator.generate([solve_prompt(p.question) for p in problems], params)
    rows = []
    for problem, (completion,) in zip(problems, outputs):
        path = split_steps(completion.text)
        result = grade(completion.text, problem)
        row = {"id": problem.id, "prediction": path.answer, "correct": result.correct,
               "completion": completion.text, "finish_reason": completion.finish_reason,
               "completion_tokens": completion.completion_tokens}
        if hooks.classifies(problem):
            kind = hooks.error_kind(problem, path.steps)
            if completion.finish_reason == "length":
                kind = kind or "truncated"
            row["error_kind"] = kind
        rows.append(row)
    return rows


def summarize_greedy_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, truncations, mean tokens and (rows with an error kind) the error mix of greedy rows."""
    mix = Counter((r["error_kind"] or "unknown") for r in rows if "error_kind" in r and not r["correct"])
    n = len(rows)
    correct = sum(r["correct"] for r in rows)
    summary = {"n": n, "correct": correct, "accuracy": correct / n if n else 0.0,
               "truncated": sum(r["finish_reason"] == "length" for r in rows),
               "mean_completion_tokens": sum(r["completion_tokens"] for r in rows) / max(n, 1)}
    if mix:
        summary["error_mix"] = dict(mix.most_common())
    return summary


def compare_greedy_rows(before_rows: list[dict], after_rows: list[dict], resamples: int, seed: int) -> dict[str, Any]:
    """Greedy accuracy before and after on the problems both row sets share, and the paired
    bootstrap interval of the change (the keys of a PPO run's eval.json)."""
    by_id = {r["id"]: r for r in after_rows}
    ids = [r["id"] for r in before_rows if r["id"] in by_id]
    b = [float(row["correct"]) for row in before_rows if row["id"] in by_id]
    a = [float(by_id[i]["correct"]) for i in ids]
    diff = paired_bootstrap_diff(b, a, resamples=resamples, seed=seed)
    return {"n": len(ids), "greedy_accuracy_before": sum(b) / len(b), "greedy_accuracy_after": sum(a) / len(a),
            "improvement": diff["diff"], "improvement_ci_low": diff["ci_low"], "improvement_ci_high": diff["ci_high"]}
