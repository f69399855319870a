"""Analysis of finished cells: each cell's record for the table, paired effects between cells
(policy against policy, StepCo against greedy, both together) and StepCo's answer changes between
its initial path and its final answer (StepCo's Figure 4)."""

from __future__ import annotations

from typing import Any

from compare.config import METHOD_NAMES, CompareConfig, policy_label
from compare.curves import graded_correct, round_answer


def cell_record(summary: dict[str, Any]) -> dict[str, Any]:
    n = summary["n"] or 1
    gen = summary["generator_prompt_tokens"] + summary["generator_completion_tokens"]
    return {
        "n": summary["n"], "correct": summary["correct"], "accuracy": summary["accuracy"],
        "accuracy_ci95": summary["accuracy_ci95"],
        "generator_prompt_tokens": summary["generator_prompt_tokens"],
        "generator_completion_tokens": summary["generator_completion_tokens"],
        "generator_tokens": gen, "verifier_tokens": summary["verifier_tokens"], "total_tokens": summary["total_tokens"],
        "tokens_per_problem": summary["total_tokens"] / n, "generator_tokens_per_problem": gen / n,
        "verifier_tokens_per_problem": summary["verifier_tokens"] / n,
        "llm_calls": summary["llm_calls"], "llm_calls_per_problem": summary["llm_calls"] / n,
        "verifier_calls": summary["verifier_calls"], "wall_seconds": summary["wall_seconds"],
        "method_seconds": summary["method_seconds"], "load_seconds": summary["load_seconds"],
        "no_prediction": summary["no_prediction"], "verifier_is_reference": summary.get("verifier_is_reference", False),
        "verifier": summary.get("verifier"), "prompt_too_long": summary.get("prompt_too_long", 0),
    }


def answer_changes(rows: list[dict], problems: dict[str, Any]) -> dict[str, Any]:
    """StepCo's Figure 4: correctness of the initial path (round 0) against the final answer."""
    counts = {"correct_to_correct": 0, "incorrect_to_correct": 0, "correct_to_incorrect": 0,
              "incorrect_to_incorrect": 0}
    revised = 0
    for row in rows:
        problem = problems[row["id"]]
        rounds = (row.get("trace") or {}).get("rounds") or []
        initial = graded_correct(round_answer(rounds, 0, row, problem.answer_kind), problem) if rounds else False
        final = bool(row.get("correct"))
        revised += bool((row.get("trace") or {}).get("revisions"))
        counts[f"{'correct' if initial else 'incorrect'}_to_{'correct' if final else 'incorrect'}"] += 1
    return {**counts, "n": len(rows), "revised": revised,
            "net_gain": counts["incorrect_to_correct"] - counts["correct_to_incorrect"]}


def paired(rows_a: list[dict], rows_b: list[dict], resamples: int, seed: int) -> dict[str, Any] | None:
    """Accuracy of b minus a on the problems both answered, with a paired bootstrap interval."""
    from reasoning.stats import paired_bootstrap_diff

    by_id = {r["id"]: r for r in rows_b}
    ids = [r["id"] for r in rows_a if r["id"] in by_id]
    if not ids:
        return None
    a = {r["id"]: float(bool(r["correct"])) for r in rows_a}
    d = paired_bootstrap_diff([a[i] for i in ids], [float(bool(by_id[i]["correct"])) for i in ids],
                              resamples=resamples, seed=seed)
    return {"diff": d["diff"], "ci95": [d["ci_low"], d["ci_high"]], "n": d["n"]}


def effects(cfg: CompareConfig, results: dict[str, dict[str, list[dict]]]) -> dict[str, Any]:
    """The paired comparisons the question asks for.

    `headline`: each PPO policy alone (greedy, against the first policy), StepCo on each policy
    (against its greedy), each PPO policy and StepCo together (against the first policy's greedy),
    and the second PPO policy against the first (greedy). `by_method`: every other policy against
    the first under every method, and the two PPO policies against each other.
    """
    base = cfg.policies[0]
    revise = "stepco" if "stepco" in cfg.eval.methods else None
    plain = "greedy" if "greedy" in cfg.eval.methods else next(iter(cfg.eval.methods))

    def diff(a: tuple[str, str], b: tuple[str, str]) -> dict[str, Any] | None:
        ra, rb = results.get(a[0], {}).get(a[1]), results.get(b[0], {}).get(b[1])
        if not (ra and rb):
            return None
        d = paired(ra, rb, cfg.eval.bootstrap_samples, cfg.eval.seed)
        return d and {"from": f"{a[0]}/{a[1]}", "to": f"{b[0]}/{b[1]}", **d}

    headline = []

    def add(what: str, a: tuple[str, str], b: tuple[str, str]) -> None:
        d = diff(a, b)
        if d:
            headline.append({"effect": what, **d})

    others = [p for p in cfg.policies if p != base]
    mname = METHOD_NAMES.get(plain, plain)
    for p in others:
        add(f"{policy_label(p)} alone ({mname})", (base, plain), (p, plain))
    if revise:
        for p in cfg.policies:
            add(f"StepCo alone, on {policy_label(p)}", (p, plain), (p, revise))
        for p in others:
            add(f"{policy_label(p)} and StepCo together", (base, plain), (p, revise))
    if len(others) >= 2:
        add(f"{policy_label(others[1])} vs {policy_label(others[0])} ({mname})", (others[0], plain), (others[1], plain))
    by_method: dict[str, dict[str, Any]] = {}
    pairs = [(base, p) for p in others] + ([(others[0], others[1])] if len(others) >= 2 else [])
    for a, b in pairs:
        row = {m: diff((a, m), (b, m)) for m in cfg.eval.methods}
        by_method[f"{b} vs {a}"] = {m: d for m, d in row.items() if d}
    return {"headline": headline, "by_method": by_method}


def recorded_seconds(artefacts: dict[str, dict[str, Any]], table: dict[str, dict[str, dict[str, Any]]]) -> float:
    """The seconds the comparison's results took to make, whichever invocation made them: each
    artefact's build time (a PPO run's own train_seconds, every resumed segment included) and each
    cell's wall time (its chunks' times, over every run that wrote them). A resumed comparison's
    own wall time counts only what was left to do."""
    built = sum(a.get("seconds") or 0.0 for a in artefacts.values())
    evaluated = sum(c.get("wall_seconds") or 0.0 for cells in table.values() for c in cells.values())
    return round(built + evaluated, 1)


def prompts_left_out(artefacts: dict[str, dict[str, Any]], table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Where prompts did not fit a model's context (`prompt_too_long`), one phrase each: evaluation
    cells (those problems count as wrong), PPO runs and the PSV's annotation (left out of them)."""
    out = [f"{policy_label(policy)} {METHOD_NAMES.get(label, label)}: {c['prompt_too_long']} problems counted wrong"
           for policy, cells in table.items() for label, c in cells.items() if c.get("prompt_too_long")]
    for name, a in artefacts.items():
        info = a.get("info") or {}
        ppo = info.get("prompt_too_long")
        if isinstance(ppo, dict) and any(ppo.values()):
            out.append(f"{name}: " + ", ".join(f"{n} {k} prompts" for k, n in ppo.items() if n) + " left out of PPO")
        annotation = (info.get("annotation") or {}).get("prompt_too_long")
        if annotation:
            out.append(f"{name}: {annotation} problems left out of the annotation")
    return out

