"""The run: artefacts trained or reused, θ calibrated, PPO runs and evaluations as jobs, then the
summary, the report and the plot; and the plan a dry run prints."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from compare.analysis import answer_changes, cell_record, effects, recorded_seconds
from compare.cache import CODE, artefacts, code_digest, methods_verifier_spec
from compare.calibration import calibrate_stepco_threshold
from compare.cells import cells, eval_groups, evaluate_policy, load_eval_problems, read_cell
from compare.config import (
    BUDGET_KEYS,
    REFERENCE,
    RESOLVED,
    VERIFIER_LM,
    CompareConfig,
    CompareError,
    method_config,
    plain,
)
from compare.curves import sample_curve, stepco_curve, token_sources
from compare.jobs import Job, log, run_jobs
from compare.plot import plot
from compare.report import write_report
from compare.train import build_ppo_inline, build_psv, build_sft, finish_ppo, ppo_command, ppo_progress, ppo_updates
from reasoning.jsonl import atomic_write
from rl.run_dir import RunDir

STAGE_COMMAND = [sys.executable, "-m", "compare"]
"""How a stage runs in its own process: `python -m compare`, there from a checkout and a wheel alike."""
"""The entry point the evaluation subprocesses run (with --stage)."""


def run(cfg: CompareConfig, out: Path, command: str = "") -> dict[str, Any]:
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs"
    (out / RESOLVED).write_text(json.dumps(plain(cfg), indent=2) + "\n")
    arts = artefacts(cfg)
    status = _artefact_status(cfg, arts)

    # 1. SFT policy, verifier LM, PSV, one after the other (everything else depends on them)
    t0 = time.time()
    calibration = _build_shared(cfg, arts, out, log_dir)
    # 2. PPO runs (side by side with workers > 1), then 3. the evaluation of every policy
    jobs = _jobs(cfg, arts, out, log_dir)
    train_seconds = time.time() - t0
    t1 = time.time()
    run_jobs(jobs, cfg.workers, log_dir)
    jobs_seconds = time.time() - t1

    # 4. collect, analyse, report
    t2 = time.time()
    problems_list, world_rows = load_eval_problems(cfg.eval, arts["sft"].spec)
    table, results, curves, changes, fingerprint = _collect(cfg, out, problems_list, bool(world_rows))
    effect_rows = effects(cfg, results)
    artefact_info = _artefact_info(cfg, arts, status)
    report_seconds = time.time() - t2
    summary = {
        "dataset": cfg.eval.dataset, "n_problems": len(problems_list), "problems_fingerprint": fingerprint,
        "policies": cfg.policies, "methods": list(cfg.eval.methods),
        "reference": REFERENCE if cfg.eval.reference_exact and world_rows and "stepco" in cfg.eval.methods else None,
        "verifier": methods_verifier_spec(cfg, arts), "seed": cfg.eval.seed,
        "stepco_threshold": calibration,
        "budgets": {"same_problems_every_cell": True, "same_seeds_every_cell": True, "verifier_tokens_counted": True,
                    "gold_at_inference": False},
        "ppo_budget": _ppo_budget(cfg, arts),
        "artefacts": artefact_info,
        "table": table, "effects": effect_rows, "answer_changes": changes, "curves": curves,
        "token_sources": token_sources(curves),
        "stage_seconds": {"sft_psv_and_calibration": round(train_seconds, 1),
                          "ppo_and_evaluation": round(jobs_seconds, 1),
                          "report": round(report_seconds, 1)},
        "total_wall_seconds": 0.0,
        "recorded_seconds": recorded_seconds(artefact_info, table),
        "command": command, "config": plain(cfg),
    }
    plot(out / "accuracy_vs_tokens.png", cfg, curves, table)
    summary["total_wall_seconds"] = round(time.time() - start, 1)
    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(out / "report.md", summary, cfg)
    log(f"done in {summary['total_wall_seconds']:.0f}s: {out / 'report.md'}, {out / 'summary.json'}, "
        f"{out / 'accuracy_vs_tokens.png'}")
    return summary


def _artefact_status(cfg: CompareConfig, arts: dict) -> dict[str, str]:
    """Each artefact given, reused (said, with a warning when other code built it) or to be trained;
    a given policy folder that is absent is refused."""
    status: dict[str, str] = {}
    for art in arts.values():
        if art.given:
            if art.kind != "psv" and not Path(art.spec).exists() and cfg.eval.backend == "hf":
                raise CompareError(f"{art.name}.path {art.spec}: no such directory")
            status[art.name] = "given"
        else:
            status[art.name] = "reused" if art.complete() else "trained"
            if art.complete():
                log(f"{art.name}: reusing {art.dir}")
                if art.marker().get("code") != code_digest(art.kind):
                    status[art.name] = "reused (built with other code)"
                    log(f"warning: {art.name} in {art.dir} was built by other (or unrecorded) versions of "
                        f"{', '.join(CODE[art.kind])}; "
                        "delete it, or set rebuild_on_code_change: true, to build it again")
    return status


def _build_shared(cfg: CompareConfig, arts: dict, out: Path, log_dir: Path) -> dict[str, Any] | None:
    """The SFT policy, the verifier LM and the PSV built where missing, then StepCo's θ calibrated
    (written into the resolved config the stages read); returns the calibration."""
    from reasoning.threads import available_cores, torch_threads

    sft, psv = arts["sft"], arts["psv"]
    # these stages run alone, one after the other, with every core (this process keeps one thread
    # otherwise): on 2 cores two 1-thread SFT runs side by side took longer than the two in turn
    with torch_threads(available_cores()) as cores:
        log(f"sft, verifier LM and psv: {cores} torch threads")
        for art in (sft, arts.get(VERIFIER_LM)):
            if art is not None and not art.complete():
                build_sft(cfg, art, log_dir)
        if not psv.complete():
            build_psv(cfg, psv, sft.spec)
        calibration = calibrate_stepco_threshold(cfg, arts, out)
    if calibration is not None:
        cfg.eval.methods["stepco"]["threshold"] = calibration["threshold"]
        (out / RESOLVED).write_text(json.dumps(plain(cfg), indent=2) + "\n")  # what the stages read
    return calibration


def _jobs(cfg: CompareConfig, arts: dict, out: Path, log_dir: Path) -> list[Job]:
    """A PPO job per policy still to train, and the evaluation jobs of every policy (after its PPO
    job), split into groups of methods where workers run side by side."""
    jobs: list[Job] = []
    for name in cfg.policies:
        art = arts[name]
        if name == "sft" or art.complete():
            continue
        log(f"{name}: to train (PPO, reward {cfg.ppo.runs[name].reward}) into {art.dir}")
        jobs.append(Job(name=f"ppo_{name}", inline=lambda n=name: build_ppo_inline(cfg, n, arts, log_dir),
                        command=ppo_command(cfg, name, arts), finish=lambda a=art: finish_ppo(a),
                        progress=lambda a=art, n=name: ppo_progress(RunDir(a.dir).metrics, ppo_updates(cfg, n))))
    train_jobs = [j.name for j in jobs]
    groups = eval_groups(cfg, cfg.eval.dataset.startswith("world"), cfg.workers)
    for name in cfg.policies:
        dep = [f"ppo_{name}"] if f"ppo_{name}" in train_jobs else []
        for k, group in enumerate(groups):
            stage = f"eval:{name}" + (f":{'+'.join(group)}" if len(groups) > 1 else "")
            cmd = [*STAGE_COMMAND, "--stage", stage, "--resolved",
                   str(out / RESOLVED), "--out", str(out)]
            job_name = f"eval_{name}" + (f"_{k + 1}" if len(groups) > 1 else "")
            jobs.append(Job(name=job_name, inline=lambda n=name, g=group: evaluate_policy(cfg, n, out, g),
                            command=cmd, after=dep, threads=1))
    return jobs


def _collect(cfg: CompareConfig, out: Path, problems_list: list, world: bool) -> tuple:
    """Every cell's summary and rows, checked complete and on the same problems; the accuracy-vs-
    tokens curves and StepCo's answer changes. Returns (table, results, curves, changes, fingerprint)."""
    from inference.evaluate import load_method

    problems = {p.id: p for p in problems_list}
    table: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, list[dict]]] = {}
    curves: dict[str, dict[str, Any]] = {}
    changes: dict[str, dict[str, Any]] = {}
    fingerprint = None
    for policy in cfg.policies:
        for label, method, options in cells(cfg, world):
            summary, rows = read_cell(out, policy, label)
            if summary is None or not summary.get("complete"):
                raise CompareError(f"{out / 'eval' / policy / label}: no complete evaluation")
            fingerprint = fingerprint or summary.get("problems_fingerprint")
            if summary.get("problems_fingerprint") != fingerprint:
                raise CompareError(f"{policy}/{label}: evaluated on other problems than the other cells")
            table.setdefault(policy, {})[label] = cell_record(summary)
            results.setdefault(policy, {})[label] = rows
            mcfg = method_config(load_method(method), options, cfg.eval.seed)
            if method in ("self_consistency", "best_of_n"):
                ns = sorted({n for n in cfg.eval.curve_n if n <= mcfg.n})
                curves.setdefault(policy, {})[label] = sample_curve(rows, method, ns, problems)
            elif method == "stepco":
                curves.setdefault(policy, {})[label] = stepco_curve(rows, mcfg.max_rounds, problems)
                changes.setdefault(policy, {})[label] = answer_changes(rows, problems)
    return table, results, curves, changes, fingerprint


def _artefact_info(cfg: CompareConfig, arts: dict, status: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What the summary says of each artefact the report reads: its status, spec, folder, hash,
    seconds and the facts its marker recorded (a PPO run's reward)."""
    artefact_info = {}
    for name, art in arts.items():
        if name not in ("sft", VERIFIER_LM, "psv") and name not in cfg.policies:
            continue
        marker = art.marker() if not art.given else {}
        info = {k: v for k, v in marker.items() if k not in ("key", "kind", "name", "hash", "finished", "seconds")}
        if art.kind == "ppo" and name in cfg.ppo.runs:
            info["reward"] = cfg.ppo.runs[name].reward
        artefact_info[name] = {"status": status[name], "spec": art.spec, "dir": str(art.dir),
                               "hash": None if art.given else art.hash, "seconds": marker.get("seconds"), "info": info}
    return artefact_info


def _ppo_budget(cfg: CompareConfig, arts: dict) -> dict[str, Any] | None:
    """The PPO runs' shared budget (with PPO's defaults filled in) and its responses, when any
    policy is trained here."""
    if not any(a.kind == "ppo" and not a.given for a in arts.values()):
        return None
    from rl.ppo_config import StepPPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(StepPPOConfig)}
    budget = {k: (v if v is not None else defaults.get(k)) for k, v in ((k, cfg.ppo.args.get(k)) for k in BUDGET_KEYS)}
    budget["responses"] = budget["max_steps"] * budget["prompts_per_update"] * budget["num_generations"]
    return budget


def plan(cfg: CompareConfig) -> dict[str, Any]:
    """What a run would do: every artefact (directory, reused or to build) and every cell."""
    arts = artefacts(cfg)
    world = cfg.eval.dataset.startswith("world")
    return {
        "artefacts": {name: {"spec": a.spec, "status": "given" if a.given else "reuse" if a.complete() else "build",
                             "hash": None if a.given else a.hash} for name, a in arts.items()},
        "policies": cfg.policies,
        "cells": [label for label, _, _ in cells(cfg, world)],
        "problems": {"dataset": cfg.eval.dataset, "n": cfg.eval.n_problems},
        "workers": cfg.workers,
    }
