"""Evaluation: every policy with every method (and the exact-checker reference) through
`inference.evaluate.evaluate`, on the same problems with the same seeds, into
`DIR/eval/<policy>/<label>/` (resumable; a cell whose settings changed starts afresh)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compare.cache import artefacts, methods_verifier_spec
from compare.config import REFERENCE, VERIFIER_LM, CompareConfig, CompareError, EvalSection, method_config
from compare.jobs import log

CELL_KEY = "compare_cell.json"

NEEDS_NO_VERIFIER = ("greedy", "self_consistency")


def load_eval_problems(ev: EvalSection, sft_dir: str):
    """The evaluation problems and, for world problems, their rows (the exact checker reads them)."""
    if ev.dataset == "world" or ev.dataset.startswith("world:"):
        from reasoning.world import generate, row_to_problem, world_config_of

        split = ev.dataset.split(":", 1)[1] if ":" in ev.dataset else "test"
        rows = generate(split, ev.n_problems, ev.world_seed,
                        world_config_of(sft_dir if Path(sft_dir).is_dir() else None))
        return [row_to_problem(r) for r in rows], rows
    from inference.evaluate import world_rows_of
    from reasoning.benchmarks import load_benchmark

    problems = list(load_benchmark(ev.dataset, data_dir=ev.data_dir, limit=ev.n_problems, source=ev.source))
    return problems, world_rows_of(problems)


def cells(cfg: CompareConfig, world: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, method module, options) of every cell of one policy, the reference last."""
    out = [(m, m, opts) for m, opts in cfg.eval.methods.items()]
    if cfg.eval.reference_exact and world and "stepco" in cfg.eval.methods:
        out.append((REFERENCE, "stepco", cfg.eval.methods["stepco"]))
    return out


def eval_groups(cfg: CompareConfig, world: bool, workers: int) -> list[list[str]]:
    """The cells of one policy split into evaluation jobs: one job with one worker; with more, BEATS
    (about half of a policy's evaluation time on the world) apart from the other methods, so that
    the last policy's evaluation does not leave cores idle while it runs alone."""
    labels = [label for label, _, _ in cells(cfg, world)]
    if workers <= 1:
        return [labels]
    heavy = [x for x in labels if x == "beats"]
    rest = [x for x in labels if x not in heavy]
    return [g for g in (heavy, rest) if g]


def _run_info(ev: EvalSection, policy: str, policy_name: str, verifier_name: str | None) -> dict[str, Any]:
    """The labels a cell's run records (its world seed on world data)."""
    run_info = {"dataset": ev.dataset, "policy": policy, "policy_name": policy_name, "verifier": verifier_name,
                "backend": ev.backend, "batch_size": ev.batch_size, "n_problems": ev.n_problems}
    if ev.dataset.startswith("world"):
        run_info["world_seed"] = ev.world_seed
    return run_info


def _cell_verifier(cfg: CompareConfig, arts: dict, label: str, method: str, verifier, exact) -> tuple[Any, Any]:
    """A cell's verifier and the name its key records: the exact checker for the reference, none for
    a method that reads none, else the methods' verifier."""
    if label == REFERENCE:
        return exact, "exact"
    if method in NEEDS_NO_VERIFIER:
        return None, None
    return verifier, methods_verifier_spec(cfg, arts, ref=True)


def _keyed_cell(cell_dir: Path, key: dict[str, Any], name: str) -> bool:
    """Writes the cell's key; True when its rows must be started afresh: the stored key differs (said),
    or rows exist with no key."""
    overwrite = False
    key_path = cell_dir / CELL_KEY
    if key_path.exists():
        try:
            stored = json.loads(key_path.read_text())
        except json.JSONDecodeError:
            stored = None
        if stored != json.loads(json.dumps(key, default=str)):
            log(f"{name}: the settings changed since {cell_dir} was written; starting it afresh")
            overwrite = True
    elif (cell_dir / "results.jsonl").exists():
        overwrite = True
    cell_dir.mkdir(parents=True, exist_ok=True)
    key_path.write_text(json.dumps(key, indent=2, default=str) + "\n")
    return overwrite


def evaluate_policy(cfg: CompareConfig, policy_name: str, out: Path, labels: Sequence[str] | None = None) -> None:
    """Every method (and the reference) on one policy, into out/eval/<policy>/<label>/ (resumable);
    only the cells named in `labels` when given."""
    from inference.evaluate import (
        _Lazy,
        build_generator,
        evaluate,
        load_method,
        problems_fingerprint,
        read_results,
    )
    from reward_models.load import load_verifier

    arts = artefacts(cfg)
    ev = cfg.eval
    policy = arts[policy_name].spec
    needed = [arts["sft"], arts[policy_name], *([arts["psv"]] if ev.verifier is None else []),
              *([arts[VERIFIER_LM]] if VERIFIER_LM in arts else [])]
    for art in needed:
        if not art.complete():
            raise CompareError(f"evaluating {policy_name}: the {art.name} artefact in {art.dir} is not complete")
    problems, world_rows = load_eval_problems(ev, arts["sft"].spec)
    fingerprint = problems_fingerprint(problems)
    ids = {p.id for p in problems}
    spec = methods_verifier_spec(cfg, arts)
    generator = _Lazy(lambda: build_generator(ev.backend, policy, batch_size=ev.batch_size, device=ev.device,
                                              **ev.backend_options), "generator")
    verifier = _Lazy(lambda: load_verifier(spec, policy, world_rows=world_rows, batch_size=ev.verifier_batch_size,
                                           device=ev.device), "verifier")
    exact = None
    try:
        for label, method, options in cells(cfg, bool(world_rows)):
            if labels is not None and label not in labels:
                continue
            module = load_method(method)
            config = method_config(module, options, ev.seed)
            if label == REFERENCE:
                exact = exact or load_verifier("exact", policy, world_rows=world_rows)
            cell_verifier, verifier_name = _cell_verifier(cfg, arts, label, method, verifier, exact)
            cell_dir = out / "eval" / policy_name / label
            key = {"policy": arts[policy_name].ref, "verifier": verifier_name, "method": method,
                   "config": dataclasses.asdict(config), "problems": fingerprint, "backend": ev.backend,
                   "backend_options": ev.backend_options, "batch_size": ev.batch_size, "chunk_size": ev.chunk_size}
            overwrite = _keyed_cell(cell_dir, key, f"{policy_name}/{label}")
            run_info = _run_info(ev, policy, policy_name, verifier_name)
            done = 0 if overwrite else len({r.get("id") for r in read_results(cell_dir)} & ids)
            if done == len(problems) and (cell_dir / "summary.json").exists():
                log(f"{policy_name}/{label}: complete in {cell_dir}, reused")
            else:
                log(f"{policy_name}/{label}: evaluating {len(problems) - done} of {len(problems)} problems")
            summary = evaluate(method, problems, generator, cell_verifier, config, cell_dir, chunk_size=ev.chunk_size,
                               run_info=run_info, verifier_is_reference=label == REFERENCE, overwrite=overwrite,
                               quiet=False, bootstrap_samples=ev.bootstrap_samples)
            log(f"{policy_name}/{label}: accuracy {summary['accuracy']:.3f} {summary['accuracy_ci95']}, "
                f"{summary['tokens_per_problem']:.0f} tokens/problem, {summary['method_seconds']:.1f}s")
    finally:
        for obj in (generator, verifier):
            obj.close()


def read_cell(out: Path, policy: str, label: str) -> tuple[dict | None, list[dict]]:
    from inference.evaluate import read_results

    cell = out / "eval" / policy / label
    try:
        summary = json.loads((cell / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None, []
    return summary, read_results(cell)
