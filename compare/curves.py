"""Accuracy against tokens from one run per cell: self-consistency and Best-of-N at each N up to
the run's (the first N samples of every problem, voted or ranked as the method does), StepCo at
each T up to the run's (the answer after round t).

Tokens are read from the traces: each sample records its own prompt, completion and verifier
tokens, each StepCo round the tokens of the generation that wrote its path and of that path's
verification. Traces written before those records existed have only per-problem totals; for
them (and only them) the totals are apportioned by characters (`apportioned_*`), and the curve
says how many rows were."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def graded_correct(pred: str | None, problem) -> bool:
    from reasoning.grading import is_correct

    return pred is not None and is_correct(pred, problem.answer, problem.answer_kind, problem.options)


def _share(total: int, part: float, whole: float, k: int, n: int) -> float:
    """`total` scaled by part / whole (or k / n when whole is 0)."""
    return total * (part / whole if whole > 0 else k / max(n, 1))


def _layout_chars(question: str, text: str) -> int:
    from reasoning.steps import split_steps
    from reward_models.verifier import layout

    steps = split_steps(text).steps
    if not steps:
        return 0
    try:
        return len(layout(question, steps).text)
    except Exception:  # noqa: BLE001 - a path the verifier would refuse: it was not scored
        return 0


def sample_curve(rows: list[dict], method: str, ns: Sequence[int], problems: dict[str, Any]) -> list[dict[str, Any]]:
    """Self-consistency or Best-of-N at each N of `ns` from one run at a larger N: the first N
    samples of every problem, voted or ranked as the method does. Tokens: prompt tokens exact (the
    same prompt per sample); completion and verifier tokens split over samples in proportion to
    their characters (the verifier's attribution rule of `Tracker.score`)."""
    from inference.methods.base import majority_vote

    points = []
    for k in ns:
        correct, prompt, completion, vtok, usable = 0, 0.0, 0.0, 0.0, 0
        for row in rows:
            trace, usage, problem = row.get("trace") or {}, row.get("usage") or {}, problems[row["id"]]
            if method == "self_consistency":
                texts, answers = list(trace.get("samples") or []), list(trace.get("answers") or [])
                scores: list[float | None] = [None] * len(texts)
            else:
                samples = trace.get("samples") or []
                texts = [s.get("text", "") for s in samples]
                answers = [s.get("answer") for s in samples]
                scores = [s.get("score") for s in samples]
            n = len(texts)
            if k > n or n == 0:
                break
            usable += 1
            if method == "self_consistency":
                winner, _ = majority_vote(answers[:k], problem.answer_kind)
            else:
                best = None
                for j in range(k):
                    if scores[j] is not None and (best is None or scores[j] > scores[best]):
                        best = j
                winner = best if best is not None else majority_vote(answers[:k], problem.answer_kind)[0]
            pred = answers[winner] if winner is not None else None
            correct += graded_correct(pred, problem)
            prompt += usage.get("prompt_tokens", 0) * k / n
            chars = [len(t) for t in texts]
            completion += _share(usage.get("completion_tokens", 0), sum(chars[:k]), sum(chars), k, n)
            if usage.get("verifier_tokens", 0):
                v = [_layout_chars(row["question"], t) if scores[j] is not None else 0 for j, t in enumerate(texts)]
                vtok += _share(usage["verifier_tokens"], sum(v[:k]), sum(v), k, n)
        if usable != len(rows) or not rows:
            continue
        m = len(rows)
        points.append({"n": k, "accuracy": correct / m, "generator_tokens_per_problem": (prompt + completion) / m,
                       "verifier_tokens_per_problem": vtok / m, "tokens_per_problem": (prompt + completion + vtok) / m,
                       "llm_calls_per_problem": float(k)})
    return points


def round_answer(rounds: list[dict], t: int, row: dict, kind: str) -> str | None:
    """The answer StepCo would give with T = t: the path after round t (the run's own prediction
    when round t is its last path)."""
    from reasoning.answers import extract_answer
    from reasoning.steps import join_steps

    if t >= len(rounds) - 1:
        return row.get("prediction")
    steps = rounds[t].get("steps") or []
    return extract_answer(join_steps(steps), kind) if steps else None


def _round_chars(question: str, rounds: list[dict], revision: str) -> list[tuple[int, int, int]]:
    """Per round: characters of its generator prompt, its completion and the path it verified."""
    from reasoning.prompts import revise_prompt, solve_prompt
    from reasoning.steps import join_steps

    out = []
    for r, entry in enumerate(rounds):
        steps = entry.get("steps") or []
        if r == 0:
            prompt, completion = len(solve_prompt(question)), len(join_steps(steps)) if steps else 0
        else:
            prev = rounds[r - 1]
            k = entry.get("revised_index") or 1
            prev_steps = prev.get("steps") or []
            try:
                if revision == "prompt":
                    p = (prev.get("scores") or [0.0] * len(prev_steps))[k - 1] if prev_steps else 0.0
                    prompt = len(revise_prompt(question, prev_steps, k, float(p)))
                else:
                    prompt = len(solve_prompt(question, prev_steps[: k - 1]))
            except (ValueError, IndexError, TypeError):
                prompt = len(solve_prompt(question))
            completion = len(join_steps(steps[k - 1:])) if steps[k - 1:] else 0
        verified = entry.get("scores") is not None and not entry.get("unusable")
        vchars = _layout_chars(question, join_steps(steps)) if verified and steps else 0
        out.append((prompt, completion, vchars))
    return out


def stepco_curve(rows: list[dict], max_rounds: int, problems: dict[str, Any]) -> list[dict[str, Any]]:
    """StepCo at T = 1..max_rounds from one T = max_rounds run: the answer after round t; tokens up
    to round t are the run's exact per-problem totals split over rounds in proportion to the
    characters of each round's (reconstructed) prompt, completion and verified path."""
    points = []
    for t in range(1, max_rounds + 1):
        correct, gen, ver, calls = 0, 0.0, 0.0, 0
        for row in rows:
            trace, usage, problem = row.get("trace") or {}, row.get("usage") or {}, problems[row["id"]]
            rounds = trace.get("rounds") or []
            if not rounds:
                continue
            correct += graded_correct(round_answer(rounds, t, row, problem.answer_kind), problem)
            chars = _round_chars(row["question"], rounds, trace.get("revision", "prompt"))
            upto = chars[: t + 1]
            gen += _share(usage.get("prompt_tokens", 0), sum(c[0] for c in upto), sum(c[0] for c in chars), len(upto),
                          len(chars))
            gen += _share(usage.get("completion_tokens", 0), sum(c[1] for c in upto), sum(c[1] for c in chars),
                          len(upto), len(chars))
            ver += _share(usage.get("verifier_tokens", 0), sum(c[2] for c in upto), sum(c[2] for c in chars),
                          len(upto), len(chars))
            calls += len(upto)
        m = len(rows) or 1
        points.append({"t": t, "accuracy": correct / m, "generator_tokens_per_problem": gen / m,
                       "verifier_tokens_per_problem": ver / m, "tokens_per_problem": (gen + ver) / m,
                       "llm_calls_per_problem": calls / m})
    return points
