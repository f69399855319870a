"""The annotation driver: problems checked and grouped, each group annotated by the chosen method
(one module each, one signature), its rows written resumably, and the run summarised."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backends.base import Generator
from backends.prompt_limits import PROMPT_TOO_LONG, prompts_fit
from reasoning.prompts import solve_prompt
from reasoning.questions import QuestionError, check_questions
from reasoning.types import Problem
from reasoning.world import world_config_of
from reward_models.annotate.autopsv import prepare as prepare_autopsv
from reward_models.annotate.base import (
    BAD_GENERATIONS,
    AnnotateConfig,
    AnnotationError,
    GroupAnnotator,
    RunStats,
    progress,
)
from reward_models.annotate.exact import annotate_group as annotate_exact
from reward_models.annotate.generator import LazyHFGenerator
from reward_models.annotate.mc import annotate_group as annotate_mc
from reward_models.annotate.outcome import annotate_group as annotate_outcome
from reward_models.annotate.tree import annotate_group as annotate_tree
from reward_models.annotate.writer import ResumableWriter, summarize

ANNOTATORS: dict[str, GroupAnnotator] = {"tree": annotate_tree, "mc": annotate_mc, "exact": annotate_exact,
                                         "outcome": annotate_outcome}
"""The methods that annotate each group as it comes (each module's `annotate_group`); `autopsv` first
trains its outcome verifier (`autopsv.prepare`), then annotates with the same signature."""


def load_problems(cfg: AnnotateConfig) -> list[Problem]:
    """The problems to annotate: world problems (with the policy's world config if it saved one) or
    any dataset of `reasoning.problem_sets`; its labels train a verifier, so a test split is refused
    unless --allow_test_split."""
    from reasoning.problem_sets import WorldDraw, check_training_split, is_world_name, load_problem_set

    world = WorldDraw(split=cfg.split, n=100 if cfg.n is None else cfg.n, seed=cfg.seed,
                      config=world_config_of(cfg.policy) if is_world_name(cfg.data) else None)
    loaded = load_problem_set(cfg.data, role="train", limit=None if cfg.data == "world" else cfg.n,
                              world=world, question_column=cfg.question_column,
                              answer_column=cfg.answer_column)
    check_training_split(loaded, "--data", cfg.allow_test_split)
    return loaded.problems


def _problems_that_fit(generator, problems: list[Problem], cfg: AnnotateConfig) -> tuple[list[Problem], int]:
    """The problems whose prompt fits the generator's context with `max_new_tokens` new tokens
    (`prompt_limits.prompts_fit`, as evaluation and PPO check it), and how many were left out (logged)."""
    context = getattr(generator, "context_length", None)
    if not context or not hasattr(generator, "count_tokens"):
        return problems, 0
    fits = prompts_fit([solve_prompt(p.question) for p in problems], context, cfg.max_new_tokens,
                       generator.count_tokens, getattr(generator, "max_token_chars", None))
    kept = [p for p, ok in zip(problems, fits) if ok]
    left_out = len(problems) - len(kept)
    if left_out:
        first = next(p.id for p, ok in zip(problems, fits) if not ok)
        print(f"--data {cfg.data}: {left_out} of {len(problems)} problems left out, {PROMPT_TOO_LONG} (the "
              f"prompt and --max_new_tokens {cfg.max_new_tokens} exceed the policy's {context}-token "
              f"context; first: {first!r})", file=sys.stderr)
    return kept, left_out


def _check_problems(problems: Sequence[Problem], cfg: AnnotateConfig) -> None:
    try:
        check_questions(problems, f"--data {cfg.data}")
    except QuestionError as err:
        raise AnnotationError(str(err)) from None
    for p in problems:
        if p.answer_kind == "none" or not p.answer.strip():
            raise AnnotationError(f"problem {p.id!r} has no gold answer; --method {cfg.method} needs one")
        world = p.meta.get("world")
        is_world = isinstance(world, dict) and "quantities" in world and "target" in world
        if world is not None and not is_world:
            raise AnnotationError(f"problem {p.id!r}: field 'world' is not a world description")
        if cfg.method == "exact" and world is None:
            raise AnnotationError(f"--method exact needs world problems; problem {p.id!r} has no 'world' "
                                  "field")


def _policy_generator(cfg: AnnotateConfig) -> Generator:
    """The policy through the hf backend, loaded on first use; a bad path is named now, in one line."""
    from backends.model_files import check_model_path

    try:
        check_model_path("--policy", cfg.policy)
    except ValueError as err:
        raise AnnotationError(str(err)) from None
    return LazyHFGenerator(cfg.policy, cfg.gen_batch_size, cfg.chat_template)


def _annotate_groups(method, generator, problems: list[Problem], cfg: AnnotateConfig, stats: RunStats,
                     writer: ResumableWriter, total: int) -> int:
    """Every group of `batch_size` problems with one not yet written, annotated and written; the
    whole group is sampled again (same seeds, same batch) so a resumed run matches. Returns how
    many problems were annotated."""
    bar = progress(None, cfg, cfg.method, total=total)
    annotated = 0
    for g, start_index in enumerate(range(0, len(problems), cfg.batch_size)):
        group = problems[start_index : start_index + cfg.batch_size]
        todo = [p for p in group if p.id not in writer.done]
        if not todo:
            continue
        rows_by_problem = method(generator, group, cfg, g, stats)
        for problem in todo:
            writer.write_problem(problem.id, rows_by_problem.get(problem.id, []))
        annotated += len(todo)
        bar.update(len(todo))
    bar.close()
    return annotated


def annotate(
    cfg: AnnotateConfig,
    generator: Generator | None = None,
    problems: Sequence[Problem] | None = None,
    train_fn: Callable[..., str] | None = None,
    verifier_factory: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Annotate problems with `cfg.method`, appending to `cfg.out`; returns the summary.

    `generator` defaults to the policy through the `hf` backend; `train_fn` and
    `verifier_factory` (autopsv) default to `reward_models.train.train_verifier` and
    `PSVVerifier.from_pretrained`.
    """
    start = time.time()
    cfg.validate()
    problems = list(load_problems(cfg) if problems is None else problems)
    _check_problems(problems, cfg)
    if len({p.id for p in problems}) != len(problems):
        raise AnnotationError("problem ids are not unique")
    if generator is None:
        generator = _policy_generator(cfg)
    problems, too_long = _problems_that_fit(generator, problems, cfg)
    writer = ResumableWriter(cfg.out, cfg.settings(), overwrite=cfg.overwrite)
    stats = RunStats()
    extra: dict[str, Any] = {PROMPT_TOO_LONG: too_long}
    try:
        if cfg.method == "autopsv":
            prepared = prepare_autopsv(generator, problems, cfg, stats, train_fn, verifier_factory)
            problems, method, extra["orm"] = prepared.problems, prepared.annotate_group, prepared.summary
        else:
            method = ANNOTATORS[cfg.method]
        skipped = sum(p.id in writer.done for p in problems)
        annotated = _annotate_groups(method, generator, problems, cfg, stats, writer, len(problems) - skipped)
    finally:
        writer.close()
    summary = {
        "method": cfg.method,
        "out": str(cfg.out),
        "problems": len(problems),
        "problems_annotated": annotated,
        "problems_resumed": skipped,
        **summarize(Path(cfg.out)),
        "generated_tokens": stats.generated_tokens,
        "generate_calls": stats.generate_calls,
        "bad_generations": {k: v for k, v in sorted(stats.counts.items()) if k in BAD_GENERATIONS},
        "counts": {k: v for k, v in sorted(stats.counts.items()) if k not in BAD_GENERATIONS},
        "dropped_on_resume": {"rows": writer.dropped_rows, "partial_lines": writer.dropped_partial_lines},
        **extra,
        "seconds": round(time.time() - start, 2),
    }
    Path(f"{cfg.out}.summary.json").write_text(json.dumps(summary, indent=2))
    return summary
