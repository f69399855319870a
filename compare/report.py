"""The markdown report of a finished comparison, rendered from its summary (summary.json)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compare.analysis import prompts_left_out, recorded_seconds
from compare.config import METHOD_NAMES, REFERENCE, RESOLVED, CompareConfig, policy_label
from reasoning.jsonl import atomic_write
from rl.rewards import REWARDS


def _fmt_ci(ci: Sequence[float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "—"


def _int(x: float) -> str:
    return f"{int(round(x)):,}"


def verifier_name(cfg: CompareConfig) -> str:
    """The methods' verifier as the config names it (short, without cache paths)."""
    if cfg.eval.verifier:
        return f"`{cfg.eval.verifier}`"
    psv = f"`{cfg.psv.path}`" if cfg.psv.path else "PSV"
    return psv if cfg.psv.combine_with is None else f"{psv} {cfg.psv.combine_rule} `{cfg.psv.combine_with}`"


def write_report(path: Path, s: dict[str, Any], cfg: CompareConfig) -> None:
    L: list[str] = []
    for section in (_intro, _artefacts_table, _accuracy_table, _effects_tables, _answer_changes_table,
                    _curves_section, _reproduce):
        L += section(s, cfg)
    atomic_write(path, "\n".join(L))


def _intro(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """The title, what was run and how long it took, the budgets, the PPO budget and StepCo's θ."""
    L: list[str] = []
    ev = cfg.eval
    recorded = recorded_seconds(s["artefacts"], s["table"])
    L.append("# Step-PPO × verify-then-revise: policies × inference methods\n")
    L.append(f"Dataset **{ev.dataset}**, **{s['n_problems']} problems** (fingerprint `{s['problems_fingerprint']}`), "
             f"backend `{ev.backend}`, verifier `{s['verifier']}`. Wall time of this invocation "
             f"{s['total_wall_seconds']:.0f} s (" + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s"
                                                         for k, v in s["stage_seconds"].items()) + "); "
             f"the artefacts and cells below took {recorded:.0f} s to build and run, resumed and earlier "
             "invocations included.\n")
    L.append("**Budgets.** Every cell answers the same problems with the same seeds (method seed "
             f"{ev.seed}; chunk c of {ev.chunk_size} problems runs with a seed derived from (seed, c)). Tokens count "
             "generator prompt and completion tokens *and* verifier tokens (what the verifier read), per problem. "
             "No method sees a gold answer at inference: the harness blinds the problems (no answer, no gold "
             "steps, no world quantities) and grades afterwards. The one exception is the row labelled "
             "*reference*, whose verifier is the world's exact step checker: an upper bound on what verify-then-"
             "revise can do with a perfect verifier, not a method.\n")
    ppo = s.get("ppo_budget")
    if ppo:
        L.append(f"**PPO budget** (the same for every PPO policy): {ppo['max_steps']} updates × "
                 f"{ppo['prompts_per_update']} prompts × {ppo['num_generations']} samples = "
                 f"{ppo['responses']:,} sampled responses from {ppo['n_prompts']} training prompts ({ppo['dataset']}), "
                 f"response limit {ppo['max_completion_length']} tokens, seed {ppo['seed']}. Rewards: "
                 + "; ".join(f"{policy_label(n)}: {run_reward(cfg, n)}" for n in cfg.ppo.runs if n in cfg.policies)
                 + ". Each PPO row is **one training seed**, one draw of a run whose gain moves from seed to seed: "
                 "the figures of this recipe over three or more seeds are in "
                 f"{cfg.ppo.seeds_page or 'docs/results/README.md'}.\n")
    cal = s.get("stepco_threshold")
    if cal and cal.get("fallback"):
        L.append(f"**StepCo's threshold** θ = {cal['threshold']} as configured: calibration on "
                 f"{cal['dev_paths']} world dev paths was not possible ({cal['fallback']}).\n")
    elif cal:
        L.append(f"**StepCo's threshold** θ = {cal['threshold']:.4f}, calibrated for earliest-error F1 "
                 f"({cal['dev_f1']:.3f}) on the SFT policy's greedy paths of {cal['dev_paths']} world *dev* problems "
                 "(not the test problems), labelled by the world's checker; the same θ for every policy "
                 f"(configured: {cal['configured_threshold']}).\n")
    return L


def _artefacts_table(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """One row per artefact: status, folder, build time and its facts."""
    L: list[str] = []
    L.append("## Artefacts\n")
    L.append("| artefact | status | directory | build time (s) | notes |")
    L.append("|---|---|---|---|---|")
    for name, a in s["artefacts"].items():
        notes = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in a.get("info", {}).items()
                          if k in ("greedy_accuracy", "paths", "updates", "reward", "train_seconds"))
        secs = a.get("seconds")
        L.append(f"| {name} | {a['status']} | `{a['spec']}` | {'' if secs is None else f'{secs:.0f}'} | {notes} |")
    L.append("")
    return L


def _accuracy_table(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """Accuracy, interval and token and call counts of every cell; prompts left out."""
    L: list[str] = []
    L.append("## Accuracy and cost\n")
    L.append("Accuracy with its 95% bootstrap interval; tokens and calls are totals over all problems (per "
             "problem in brackets); wall time is the method's own time (model loading excluded).\n")
    L.append("| policy | method | accuracy | 95% CI | generator tokens (prompt + completion) | verifier tokens | "
             "tokens / problem | LLM calls | wall s |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for policy in cfg.policies:
        for label, c in s["table"].get(policy, {}).items():
            mname = METHOD_NAMES.get(label, label)
            if label == REFERENCE:
                mname = f"*{mname}*"
            L.append(f"| {policy_label(policy)} | {mname} | {c['accuracy']:.3f} | {_fmt_ci(c['accuracy_ci95'])} | "
                     f"{_int(c['generator_tokens'])} ({_int(c['generator_prompt_tokens'])} + "
                     f"{_int(c['generator_completion_tokens'])}) | {_int(c['verifier_tokens'])} | "
                     f"{c['tokens_per_problem']:.0f} | {_int(c['llm_calls'])} ({c['llm_calls_per_problem']:.1f}) | "
                     f"{c['method_seconds']:.1f} |")
    L.append("")
    left_out = prompts_left_out(s["artefacts"], s["table"])
    if left_out:
        L.append("**Prompts beyond the model's context** (`prompt_too_long`, never run): " + "; ".join(left_out)
                 + ".\n")
    return L


def _effects_tables(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """The headline paired effects, and policy against policy under each method."""
    L: list[str] = []
    eff = s["effects"]
    if eff["headline"]:
        L.append("## Effects (paired on the same problems)\n")
        L.append("Accuracy difference and its 95% paired bootstrap interval (problems resampled once, both "
                 "outcomes of each drawn problem kept); an interval that excludes 0 is a difference these problems "
                 "resolve.\n")
        L.append("| effect | from → to | Δ accuracy | 95% CI |")
        L.append("|---|---|---|---|")
        for e in eff["headline"]:
            L.append(f"| {e['effect']} | {e['from']} → {e['to']} | {e['diff']:+.3f} | "
                     f"[{e['ci95'][0]:+.3f}, {e['ci95'][1]:+.3f}] |")
        L.append("")
    if eff["by_method"]:
        methods = list(cfg.eval.methods)
        L.append("Policy against policy under each method (Δ accuracy [95% paired CI]):\n")
        L.append("| comparison | " + " | ".join(METHOD_NAMES.get(m, m) for m in methods) + " |")
        L.append("|---|" + "---|" * len(methods))
        for what, row in eff["by_method"].items():
            b, _, a = what.partition(" vs ")
            cells_ = [f"{row[m]['diff']:+.3f} [{row[m]['ci95'][0]:+.3f}, {row[m]['ci95'][1]:+.3f}]" if m in row else "—"
                      for m in methods]
            L.append(f"| {policy_label(b)} vs {policy_label(a)} | " + " | ".join(cells_) + " |")
        L.append("")
    return L


def _answer_changes_table(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """StepCo's answer changes between its first path and its answer, per cell."""
    L: list[str] = []
    if s["answer_changes"]:
        L.append("## StepCo's answer changes (its Figure 4)\n")
        L.append("Between the initial path (round 0 of StepCo's trace, the policy's greedy path) and StepCo's final "
                 "answer, graded against gold afterwards.\n")
        L.append("| policy | verifier | correct → correct | incorrect → correct | correct → incorrect | "
                 "incorrect → incorrect | revised | net |")
        L.append("|---|---|---|---|---|---|---|---|")
        for policy in cfg.policies:
            for label, a in s["answer_changes"].get(policy, {}).items():
                ver = "exact checker (reference)" if label == REFERENCE else verifier_name(cfg)
                L.append(f"| {policy_label(policy)} | {ver} | {a['correct_to_correct']} | "
                         f"{a['incorrect_to_correct']} | "
                         f"{a['correct_to_incorrect']} | {a['incorrect_to_incorrect']} | {a['revised']} of {a['n']} | "
                         f"{a['net_gain']:+d} |")
        L.append("")
    return L


def _curves_section(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """The plot, how its points are read from one run per cell, and the points as a table."""
    ev = cfg.eval
    L: list[str] = []
    L.append("## Accuracy against tokens\n")
    L.append("![accuracy vs tokens](accuracy_vs_tokens.png)\n")
    L.append("One colour per policy, one marker per method. Self-consistency and Best-of-N at N = "
             f"{', '.join(map(str, ev.curve_n))} come from **one run at N = max** per cell: the first N samples of "
             "each problem are voted (self-consistency) or ranked by the verifier (Best-of-N, majority vote when "
             "none of them could be scored) as the method does, and their tokens are those the first N samples "
             "spent, read from the trace (each sample records its prompt, completion and verifier tokens). StepCo at "
             "T = 1..max_rounds comes from **one run at T = max_rounds**: the answer after round t, and the tokens "
             "of rounds 0..t, read from the trace (each round records the tokens of the generation that wrote its "
             "path and of that path's verification). At N = max and T = max_rounds the points are the measured "
             "totals. BEATS and greedy are single points.\n")
    sources = s.get("token_sources") or {}
    notes = [text for text in sources.values() if text.startswith("apportioned")]
    if notes:
        L.append("**Apportioned tokens** (cells evaluated before the traces recorded tokens per sample or per "
                 "round; re-run them for read values): " + "; ".join(notes) + ".\n")
    L.append("| policy | method | points (N or T: accuracy @ tokens/problem) |")
    L.append("|---|---|---|")
    for policy in cfg.policies:
        for method, pts in s["curves"].get(policy, {}).items():
            k = "n" if method in ("self_consistency", "best_of_n") else "t"
            text = "; ".join(f"{'N' if k == 'n' else 'T'}={p[k]}: {p['accuracy']:.3f} @ {p['tokens_per_problem']:.0f}"
                             for p in pts)
            L.append(f"| {policy_label(policy)} | {METHOD_NAMES.get(method, method)} | {text} |")
    L.append("")
    return L


def _reproduce(s: dict[str, Any], cfg: CompareConfig) -> list[str]:
    """The command, the resolved config and where the rows are."""
    L: list[str] = []
    L.append("## Reproduce\n")
    L.append(f"```\n{s['command']}\n```\n")
    L.append(f"The resolved config is `{RESOLVED}`; every cell's rows are in `eval/<policy>/<method>/results.jsonl`.\n")
    return L


def run_reward(cfg: CompareConfig, name: str) -> str:
    """What a PPO run's reward pays, in words, from its --reward and advantage estimator."""
    run = cfg.ppo.runs[name]
    args = {**cfg.ppo.args, **run.args}
    estimator = args.get("advantage_estimator", "group")
    paid = {"gold": "the answer check (1 right, 0 wrong) at the last token",
            "step": "the verifier's score of each step at its end",
            "outcome": "the verifier's score of the whole path at the last token",
            "step+gold": "the verifier's score of each step and the answer check",
            "progress": "each step's progress under the prover (its change in the answer-check success rate of "
                        f"{args.get('prover', 'policy')}'s continuations)",
            "gold+progress": f"the answer check and {args.get('progress_coef', 1.0)} x each step's progress under "
                             f"the prover ({args.get('prover', 'policy')})"}.get(run.reward, run.reward)
    if estimator == "mc_values":
        return (f"{paid}, credited to steps by Monte Carlo values ({args.get('mc_rollouts', 4)} continuations "
                "from each step boundary, graded by the answer check; no verifier)")
    mode = REWARDS.get(run.reward)
    return f"{paid}, {estimator} advantages" + (" (no verifier)" if mode is not None and not mode.verifier else "")
