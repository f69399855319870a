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

from compare.config import REFERENCE


def graded_correct(pred: str | None, problem) -> bool:
    """Whether an answer is right, graded against the problem's gold answer."""
    from reasoning.grading import is_correct

    return pred is not None and is_correct(pred, problem.answer, problem.answer_kind, problem.options)


def _split(total: float, weights: Sequence[float]) -> list[float]:
    """`total` split in proportion to `weights` (evenly when they are all 0)."""
    whole = sum(weights)
    if not weights:
        return []
    return [total * (w / whole if whole > 0 else 1 / len(weights)) for w in weights]


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


def sample_tokens(row: dict, method: str) -> tuple[list[tuple[float, float, float]], bool]:
    """(prompt, completion, verifier) tokens of each sample of a self-consistency or Best-of-N row,
    and whether they were read from the trace (False: apportioned, a trace without the records)."""
    trace = row.get("trace") or {}
    if method == "self_consistency":
        prompt, completion = trace.get("prompt_tokens"), trace.get("completion_tokens")
        n = len(trace.get("samples") or [])
        if isinstance(prompt, list) and isinstance(completion, list) and len(prompt) == len(completion) == n:
            return [(p, c, 0.0) for p, c in zip(prompt, completion)], True
    else:
        samples = trace.get("samples") or []
        keys = ("prompt_tokens", "completion_tokens", "verifier_tokens")
        if all(k in s for s in samples for k in keys):
            return [tuple(float(s[k]) for k in keys) for s in samples], True
    return apportioned_sample_tokens(row, method), False


def apportioned_sample_tokens(row: dict, method: str) -> list[tuple[float, float, float]]:
    """The fallback for traces written without per-sample tokens: the row's exact totals split
    over its samples, prompt tokens evenly (one prompt per sample), completion tokens by each
    sample's characters, verifier tokens by the characters of each scored path's verifier input
    (the attribution rule of `Tracker.score`)."""
    trace, usage = row.get("trace") or {}, row.get("usage") or {}
    if method == "self_consistency":
        texts = list(trace.get("samples") or [])
        scored = [False] * len(texts)
    else:
        samples = trace.get("samples") or []
        texts = [s.get("text", "") for s in samples]
        scored = [s.get("score") is not None for s in samples]
    n = len(texts)
    prompt = _split(usage.get("prompt_tokens", 0), [1.0] * n)
    completion = _split(usage.get("completion_tokens", 0), [len(t) for t in texts])
    verifier = _split(usage.get("verifier_tokens", 0),
                      [_layout_chars(row["question"], t) if ok else 0 for t, ok in zip(texts, scored)])
    return list(zip(prompt, completion, verifier))


def sample_curve(rows: list[dict], method: str, ns: Sequence[int], problems: dict[str, Any]) -> list[dict[str, Any]]:
    """Self-consistency or Best-of-N at each N of `ns` from one run at a larger N: the first N
    samples of every problem, voted or ranked as the method does, and their tokens (`sample_tokens`).
    A point records how many rows' tokens were apportioned (`apportioned_rows`, 0 for traces with
    per-sample records)."""
    from inference.methods.base import majority_vote

    tokens = [sample_tokens(row, method) for row in rows]
    points = []
    for k in ns:
        correct, prompt, completion, vtok, usable = 0, 0.0, 0.0, 0.0, 0
        for row, (per_sample, _) in zip(rows, tokens):
            trace, problem = row.get("trace") or {}, problems[row["id"]]
            if method == "self_consistency":
                answers = list(trace.get("answers") or [])
                scores: list[float | None] = [None] * len(answers)
            else:
                samples = trace.get("samples") or []
                answers = [s.get("answer") for s in samples]
                scores = [s.get("score") for s in samples]
            n = len(answers)
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
            prompt += sum(t[0] for t in per_sample[:k])
            completion += sum(t[1] for t in per_sample[:k])
            vtok += sum(t[2] for t in per_sample[:k])
        if usable != len(rows) or not rows:
            continue
        m = len(rows)
        points.append({"n": k, "accuracy": correct / m, "generator_tokens_per_problem": (prompt + completion) / m,
                       "verifier_tokens_per_problem": vtok / m, "tokens_per_problem": (prompt + completion + vtok) / m,
                       "llm_calls_per_problem": float(k),
                       "apportioned_rows": sum(not read for _, read in tokens)})
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


def round_tokens(row: dict) -> tuple[list[tuple[float, float, float]], bool]:
    """(prompt, completion, verifier) tokens of each round of a StepCo row, and whether they were
    read from the trace (False: apportioned, a trace without the per-round records)."""
    trace = row.get("trace") or {}
    rounds = trace.get("rounds") or []
    keys = ("prompt_tokens", "completion_tokens", "verifier_tokens")
    if all(k in r for r in rounds for k in keys):
        return [tuple(float(r[k]) for k in keys) for r in rounds], True
    return apportioned_round_tokens(row), False


def apportioned_round_tokens(row: dict) -> list[tuple[float, float, float]]:
    """The fallback for traces written without per-round tokens: the row's exact totals split over
    its rounds in proportion to the characters of each round's (reconstructed) prompt, completion
    and verified path."""
    trace, usage = row.get("trace") or {}, row.get("usage") or {}
    chars = _round_chars(row["question"], trace.get("rounds") or [], trace.get("revision", "prompt"))
    prompt = _split(usage.get("prompt_tokens", 0), [c[0] for c in chars])
    completion = _split(usage.get("completion_tokens", 0), [c[1] for c in chars])
    verifier = _split(usage.get("verifier_tokens", 0), [c[2] for c in chars])
    return list(zip(prompt, completion, verifier))


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
    """StepCo at T = 1..max_rounds from one T = max_rounds run: the answer after round t, and the
    tokens of rounds 0..t (`round_tokens`). A point records how many rows' tokens were apportioned
    (`apportioned_rows`, 0 for traces with per-round records)."""
    tokens = [round_tokens(row) for row in rows]
    points = []
    for t in range(1, max_rounds + 1):
        correct, gen, ver, calls = 0, 0.0, 0.0, 0
        for row, (per_round, _) in zip(rows, tokens):
            problem = problems[row["id"]]
            rounds = (row.get("trace") or {}).get("rounds") or []
            if not rounds:
                continue
            correct += graded_correct(round_answer(rounds, t, row, problem.answer_kind), problem)
            upto = per_round[: t + 1]
            gen += sum(r[0] + r[1] for r in upto)
            ver += sum(r[2] for r in upto)
            calls += len(upto)
        m = len(rows) or 1
        points.append({"t": t, "accuracy": correct / m, "generator_tokens_per_problem": gen / m,
                       "verifier_tokens_per_problem": ver / m, "tokens_per_problem": (gen + ver) / m,
                       "llm_calls_per_problem": calls / m,
                       "apportioned_rows": sum(not read for _, read in tokens)})
    return points


def token_sources(curves: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, str]:
    """How the curves' tokens were obtained, per kind of curve: read from the traces' per-sample or
    per-round records, or (old traces) apportioned, with the cells and rows that were."""
    out = {}
    for kind, methods, unit in (("sample_curves", ("self_consistency", "best_of_n"), "per-sample"),
                                ("stepco_curve", ("stepco", REFERENCE), "per-round")):
        apportioned = [f"{policy}/{label} ({pts[0]['apportioned_rows']} rows)"
                       for policy, cells in curves.items() for label, pts in cells.items()
                       if label in methods and pts and pts[0].get("apportioned_rows")]
        if apportioned:
            out[kind] = (f"apportioned by characters in {', '.join(apportioned)}: traces written without "
                         f"{unit} token records; read from the records elsewhere")
        else:
            out[kind] = f"read from the traces' {unit} token records"
    return out
