"""`autopsv` (AutoPSV): an outcome verifier (`reward_models.annotate.orm`) labels the paths of the
problems it was not trained on from its step scores alone: a step is wrong when the score falls by
more than `--drop_threshold` relative to the step before (`autopsv_labels`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoning.types import Problem
from reward_models.annotate.base import AnnotateConfig, GroupAnnotator, RunStats, derive_seed, make_row
from reward_models.annotate.orm import OrmInfo, counted_scores, prepare_orm
from reward_models.annotate.sampling import sample_paths


def autopsv_labels(scores: Sequence[float], baseline: float, threshold: float = -0.5) -> list[float]:
    """AutoPSV's labels from an outcome verifier's per-step scores (see the module docstring).

    Step k is wrong when (s_k - s_{k-1}) / s_{k-1} < threshold, with s_{-1} = `baseline`; a
    previous score <= 0 counts as no change. Every step from the first wrong one on gets 0.0.
    """
    labels: list[float] = []
    previous, wrong = float(baseline), False
    for score in scores:
        score = float(score)
        if not wrong:
            change = (score - previous) / previous if previous > 0 else 0.0
            wrong = change < threshold
        labels.append(0.0 if wrong else 1.0)
        previous = score
    return labels


@dataclass
class Prepared:
    """What AutoPSV annotates once its ORM is there."""

    problems: list[Problem]
    """The problems to label: those the ORM was not trained on."""
    annotate_group: GroupAnnotator
    summary: dict[str, Any]
    """The ORM's record for the run's summary."""


def prepare(generator, problems: Sequence[Problem], cfg: AnnotateConfig, stats: RunStats,
            train_fn: Callable[..., str] | None = None, verifier_factory: Callable[[str], Any] | None = None,
            ) -> Prepared:
    """Train the ORM (or reuse it, `prepare_orm`) and return the labelling of the other problems."""
    orm = prepare_orm(generator, problems, cfg, stats, train_fn, verifier_factory)
    if verifier_factory is None:
        from reward_models.psv import PSVVerifier

        verifier_factory = PSVVerifier.from_pretrained
    train_ids = set(orm.train_problem_ids)
    summary = {"dir": str(Path(cfg.orm_dir or f"{cfg.out}.orm")), "model": orm.model_path,
               "reused": orm.reused, "train_problems": len(train_ids), "train_paths": orm.train_paths,
               "train_correct": orm.train_correct, "baseline": orm.baseline}
    kept = [p for p in problems if p.id not in train_ids]
    return Prepared(kept, make_annotator(orm, verifier_factory), summary)


def make_annotator(orm: OrmInfo, verifier_factory: Callable[[str], Any]) -> GroupAnnotator:
    """AutoPSV's labelling of a group; the ORM is loaded on first use (a finished run never loads it)."""
    loaded: list[Any] = []

    def annotate_group(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
        if not loaded:
            loaded.append(verifier_factory(orm.model_path))
        verifier = loaded[0]
        sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
        flat = [(i, k, path) for i, paths in enumerate(sampled) for k, path in enumerate(paths)]
        scores = counted_scores(verifier, [problems[i].question for i, _, _ in flat],
                                [p.steps for _, _, p in flat], stats)
        out: dict[str, list[dict]] = {p.id: [] for p in problems}
        for (i, k, path), path_scores in zip(flat, scores):
            if path_scores is None:
                continue
            labels = autopsv_labels(path_scores, orm.baseline, cfg.drop_threshold)
            out[problems[i].id].append(make_row(problems[i], "autopsv", k, path.steps, labels, path.correct,
                                                orm_scores=[float(s) for s in path_scores]))
        return out

    return annotate_group
