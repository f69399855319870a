"""AutoPSV's outcome verifier: trained once on the answer checks of the policy's own paths for a share
of the problems (`reward_models.train.train_verifier(..., outcome_only=True)`), kept under
`<out>.orm/` and reused by a later run with the same settings."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoning.types import Problem
from reward_models.annotate.base import AnnotateConfig, AnnotationError, RunStats, derive_seed, progress
from reward_models.annotate.sampling import sample_paths


def counted_scores(verifier, questions: list[str], paths: list[list[str]], stats: RunStats,
                   ) -> list[list[float] | None]:
    """The verifier's step scores (`reward_models.scoring.score_paths`); a path it cannot score gets
    None and is counted (`path_unscorable`)."""
    from reward_models.scoring import score_paths

    scored = score_paths(verifier, questions, paths)
    stats.count("path_unscorable", scored.unscorable)
    return scored.scores


@dataclass
class OrmInfo:
    """The outcome verifier AutoPSV labels with, and the baseline of its first-step scores."""

    model_path: str
    baseline: float
    train_problem_ids: list[str]
    train_paths: int
    train_correct: int
    reused: bool = False


def orm_split(problem_ids: Sequence[str], fraction: float, seed: int) -> list[str]:
    """The problem ids whose paths train the ORM: a seeded share, at least one, leaving one out."""
    ids = list(problem_ids)
    random.Random(f"autopsv-{seed}").shuffle(ids)
    k = max(1, round(fraction * len(ids)))
    if len(ids) > 1:
        k = min(k, len(ids) - 1)
    return sorted(ids[:k], key=list(problem_ids).index)


def prepare_orm(generator, problems: Sequence[Problem], cfg: AnnotateConfig, stats: RunStats,
                train_fn: Callable[..., str] | None = None,
                verifier_factory: Callable[[str], Any] | None = None) -> OrmInfo:
    """Train AutoPSV's outcome verifier, or reuse the one already in the ORM directory.

    The directory is written under a temporary name and renamed when complete, so a killed run
    leaves no half-trained model that a later run would reuse.
    """
    orm_dir = Path(cfg.orm_dir or f"{cfg.out}.orm")
    info_path = orm_dir / "autopsv.json"
    if info_path.exists():
        return _reused_orm(orm_dir, cfg)
    if orm_dir.exists():
        raise AnnotationError(f"{orm_dir} exists but holds no autopsv.json; remove it or choose --orm_dir")
    if train_fn is None:
        from reward_models.train import train_verifier as train_fn
    if verifier_factory is None:
        from reward_models.psv import PSVVerifier

        verifier_factory = PSVVerifier.from_pretrained
    train_ids = set(orm_split([p.id for p in problems], cfg.orm_train_fraction, cfg.seed))
    rows = _orm_rows(generator, [p for p in problems if p.id in train_ids], cfg, stats)
    questions, paths = [r["prompt"] for r in rows], [r["completions"] for r in rows]
    if not rows:
        raise AnnotationError("autopsv: the policy wrote no path with a step for the ORM-training problems")
    tmp = orm_dir.with_name(orm_dir.name + ".tmp")
    returned = _train_orm(rows, tmp, cfg, train_fn)
    try:
        relative = str(returned.relative_to(tmp.resolve()))
    except ValueError:
        relative = None
    scores = counted_scores(verifier_factory(str(returned)), questions, paths, stats)
    firsts = [s[0] for s in scores if s]
    if not firsts:
        raise AnnotationError("autopsv: the ORM could score none of its training paths")
    info = {
        "model_path": relative if relative is not None else str(returned),
        "baseline": sum(firsts) / len(firsts),
        "train_problem_ids": sorted(train_ids, key=[p.id for p in problems].index),
        "train_paths": len(rows),
        "train_correct": sum(r["answer_correct"] for r in rows),
        "settings": orm_settings(cfg),
    }
    with (tmp / "orm_train_rows.jsonl").open("w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    (tmp / "autopsv.json").write_text(json.dumps(info, indent=2))
    os.replace(tmp, orm_dir)
    model_path = str(orm_dir / relative) if relative is not None else str(returned)
    return OrmInfo(model_path, info["baseline"], info["train_problem_ids"], info["train_paths"],
                   info["train_correct"])


def _train_orm(rows: list[dict], tmp: Path, cfg: AnnotateConfig, train_fn: Callable[..., str]) -> Path:
    """The ORM trained on `rows` into the fresh folder `tmp` (MSE on the outcome labels); the folder
    of the model it returns, resolved."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        returned = train_fn(rows, init_from=cfg.policy, output_dir=str(tmp), loss="mse", outcome_only=True,
                            lora=cfg.orm_lora, num_train_epochs=cfg.orm_epochs,
                            learning_rate=cfg.orm_learning_rate,
                            per_device_train_batch_size=cfg.orm_batch_size, seed=cfg.seed,
                            max_steps=cfg.orm_max_steps, skip_bad_rows=True)
    except ValueError as err:  # e.g. no trainable row
        raise AnnotationError(f"autopsv: training the ORM in {tmp} failed: {err}") from err
    return Path(returned or tmp).resolve()


def _reused_orm(orm_dir: Path, cfg: AnnotateConfig) -> OrmInfo:
    """The ORM a finished run left in `orm_dir`, refused if it was trained with other settings."""
    info = json.loads((orm_dir / "autopsv.json").read_text())
    if info.get("settings") != orm_settings(cfg):
        raise AnnotationError(f"{orm_dir} was trained with other settings ({info.get('settings')}); "
                              "remove it or choose --orm_dir")
    model_path = info["model_path"]
    if not Path(model_path).is_absolute():
        model_path = str(orm_dir / model_path)
    return OrmInfo(model_path, info["baseline"], info["train_problem_ids"], info["train_paths"],
                   info["train_correct"], reused=True)


def _orm_rows(generator, train_problems: list[Problem], cfg: AnnotateConfig, stats: RunStats) -> list[dict]:
    """The policy's sampled paths of the ORM-training problems, each labelled on every step with
    whether its answer is right (AutoPSV's outcome labels)."""
    rows = []
    for start in progress(range(0, len(train_problems), cfg.batch_size), cfg, "autopsv: ORM paths"):
        group = train_problems[start : start + cfg.batch_size]
        seed = derive_seed(cfg.seed, "orm_paths", start // cfg.batch_size)
        sampled = sample_paths(generator, group, cfg, seed, stats)
        for problem, problem_paths in zip(group, sampled):
            for k, path in enumerate(problem_paths):
                rows.append({"id": f"{problem.id}/orm/{k}", "problem_id": problem.id,
                             "prompt": problem.question, "completions": path.steps,
                             "labels": [float(path.correct)] * len(path.steps),
                             "answer_correct": path.correct})
    return rows


def orm_settings(cfg: AnnotateConfig) -> dict[str, Any]:
    names = ("policy", "data", "split", "seed", "paths_per_problem", "temperature", "max_new_tokens",
             "orm_train_fraction", "orm_epochs", "orm_learning_rate", "orm_batch_size", "orm_max_steps",
             "orm_lora")
    return {name: getattr(cfg, name) for name in names}
