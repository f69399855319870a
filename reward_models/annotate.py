"""Process annotation: step labels for a policy's own reasoning paths, without human labels.

    python -m reward_models.annotate --method {tree,mc,autopsv,exact,outcome} --policy D \\
        [--data world | F.jsonl | gsm8k] [--n N] [--seed S] --out A.jsonl

Every method samples paths from the policy `D` and gives each step a label in [0, 1], the
estimated probability that the path so far still leads to the correct answer:

- ``tree`` (StepCo): a binary tree per question. Each node's two children are one-step
  continuations of the node's prefix, one from the positive prompt (`solve_prompt`, sampled at
  `--temperature_pos`) and one from the exploratory prompt (`explore_prompt`,
  `--temperature_neg`); identical sibling steps (after strip) are kept once. A step that states
  an answer (`<ans>`, "answer is", `\\boxed`) is a leaf; so is a step at `--max_depth` (capped), a
  step cut by the token limit (truncated) and a node whose continuations were all empty (dead
  end); leaves without an answer are incorrect. A step's label is the fraction of the leaves
  below it (itself included) whose answer is correct, so a parent's label is the leaf-weighted
  mean of its children's labels. One row per root-to-leaf path.
- ``mc`` (Math-Shepherd): `--paths_per_problem` full paths at `--temperature`; from each prefix
  steps[:i+1] (every step but the last) `--rollouts` completions; the step's soft label is the
  fraction that reach the gold answer (`--hard`: 1.0 if any does). The last step's label is the
  path's own correctness. Identical prefixes of one question share their rollouts.
- ``autopsv`` (AutoPSV): paths sampled as in mc. The paths of an `--orm_train_fraction` of the
  questions, labelled with their answer correctness only, train an outcome verifier with
  `reward_models.train.train_verifier(..., outcome_only=True)`, initialised from the policy and
  saved under `<out>.orm/` (reused when it is already there). The paths of the *other* questions
  are then labelled from the verifier's per-step scores s_0..s_{n-1} alone, no gold answer used.
  With s_{-1} the mean score of the first step over all ORM-training paths (the baseline):

      step k is wrong   if  (s_k - s_{k-1}) / s_{k-1} < --drop_threshold   (default -0.5)

  i.e. when the verifier's confidence falls by more than half from the step before (a previous
  score of 0 cannot fall further: no drop). Once a step is wrong every later step is wrong too
  (label 0.0); all other steps get 1.0. Rows also carry the scores (`orm_scores`).
- ``exact`` (world problems only, a reference): paths sampled as in mc, labelled by the world's
  step checker.
- ``outcome`` (any data with gold answers): paths sampled as in mc, every step labelled with the
  path's answer check (1.0 right, 0.0 wrong) and no rollout: the outcome-labelled samples an
  outcome verifier or PRIME's implicit PRM (`reward_models.implicit_prm`) learns from.

Output: a TRL stepwise-supervision JSONL file, one row per path::

    {"id": "<problem_id>/<method>/<k>", "problem_id", "prompt": <question>, "completions": [steps],
     "labels": [floats], "method", "answer_correct": bool, "exact_labels": [...] (world rows)}

where `exact_labels` (1.0 before the world checker's earliest error, 0.0 from it on) measure label
quality. A JSON summary (also written to `<out>.summary.json`) gives problems, rows, steps, the
mean label, generated tokens, seconds, counts of bad generations (no steps, no answer, truncated,
empty or duplicate steps), the problems left out because their prompt does not fit the policy's
context with `--max_new_tokens` (`prompt_too_long`; an empty question is refused) and, on world data, the agreement with the exact labels (mean absolute
error and the accuracy of `label >= 0.5`).

Resuming: problems are annotated in groups of `--batch_size`: all paths, all rollouts, or all
frontier nodes of a tree level (one call per prompt style, their temperatures differ) of a group
go into one generate call. After a group, the rows of each of its problems are appended
together and fsynced, then the problem id and its row count go to `<out>.done`. On start, rows of
problems without a matching done entry (a run killed mid-write) and a trailing partial line are
dropped, and finished problems are skipped; a group is re-sampled with the same seeds, so a
resumed run writes the same rows as an uninterrupted one. `<out>.meta.json` holds the settings;
resuming with other settings is refused (`--overwrite` starts afresh).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from inference.backends.base import Completion, Generator, SamplingParams
from inference.backends.prompt_limits import PROMPT_TOO_LONG, prompts_fit
from reasoning.benchmarks import DatasetError
from reasoning.grading import grade
from reasoning.jsonl import read_resumable_jsonl, write_jsonl
from reasoning.prompts import explore_prompt, solve_prompt
from reasoning.questions import QuestionError, check_questions
from reasoning.steps import CLOSE_TAG, answer_correct, has_answer, prefix_text, split_steps
from reasoning.types import Problem
from reasoning.world import earliest_error, world_config_of

__all__ = [
    "METHODS",
    "AnnotateConfig",
    "AnnotationError",
    "TreeNode",
    "annotate",
    "autopsv_labels",
    "exact_labels",
    "main",
    "mc_label",
    "tree_paths",
]

METHODS = ("tree", "mc", "autopsv", "exact", "outcome")
STEP_STOP = (CLOSE_TAG,)
BAD_GENERATIONS = frozenset({
    "path_no_steps", "path_no_answer", "path_truncated", "step_empty", "leaf_truncated", "leaf_capped",
    "leaf_dead_end", "rollout_no_answer", "rollout_truncated", "path_unscorable", "problem_no_paths",
})
"""Counted events that are bad generations: no steps, no answer, cut by the token limit, unscorable."""


class AnnotationError(ValueError):
    """Settings or inputs the annotation cannot work with; the message says which."""


@dataclass
class AnnotateConfig:
    """Settings of `python -m reward_models.annotate`."""

    method: str = field(metadata={"help": "Annotation method.", "choices": list(METHODS)})
    policy: str = field(metadata={"help": "Policy model directory (save_pretrained) that samples the paths."})
    out: str = field(metadata={"help": "Output JSONL file (rows are appended; a run resumes)."})
    data: str = field(default="world", metadata={"help": "'world', a .jsonl/.json/.parquet/.csv file, a save_to_disk "
                                                          "folder (FOLDER[:SPLIT], default train) or a Hub id "
                                                          "(ID[:CONFIG]:SPLIT); a test split (a benchmark name, a "
                                                          "file named *test*) needs --allow_test_split."})
    n: int | None = field(default=None, metadata={"help": "Problems: world count (default 100), file limit."})
    split: str = field(default="train", metadata={"help": "World split for --data world."})
    question_column: str | None = field(default=None, metadata={"help": "Column of the question (default: the "
                                                                        "first of question, problem, prompt)."})
    answer_column: str | None = field(default=None, metadata={"help": "Column of the gold answer (default: the first "
                                                                      "of answer, solution, completion)."})
    allow_test_split: bool = field(default=False, metadata={"help": "Annotate a test split all the same (its labels "
                                                                    "train a verifier)."})
    seed: int = field(default=0, metadata={"help": "Seed of the world problems, sampling and ORM training."})
    batch_size: int = field(default=8, metadata={"help": "Problems annotated together (one generate call)."})
    gen_batch_size: int = field(default=64, metadata={"help": "Sequences per forward pass of the backend."})
    max_new_tokens: int = field(default=192, metadata={"help": "Token limit of a full path or a rollout."})
    step_max_new_tokens: int = field(default=64, metadata={"help": "Token limit of one step (tree)."})
    temperature_pos: float = field(default=0.7, metadata={"help": "tree: temperature of the positive prompt."})
    temperature_neg: float = field(default=1.0, metadata={"help": "tree: temperature of the exploratory prompt."})
    max_depth: int = field(default=8, metadata={"help": "tree: most steps on a path (deeper = capped leaf)."})
    paths_per_problem: int = field(default=4, metadata={"help": "mc/autopsv/exact/outcome: sampled paths per problem."})
    temperature: float = field(default=1.0, metadata={"help": "mc/autopsv/exact/outcome: sampling temperature."})
    rollouts: int = field(default=4, metadata={"help": "mc: completions sampled from each prefix."})
    hard: bool = field(default=False, metadata={"help": "mc: label 1.0 if any rollout is right (else soft)."})
    orm_train_fraction: float = field(default=0.5, metadata={"help": "autopsv: share of problems training the ORM."})
    drop_threshold: float = field(default=-0.5, metadata={"help": "autopsv: relative score change marking a wrong step."})
    orm_dir: str | None = field(default=None, metadata={"help": "autopsv: ORM directory (default <out>.orm)."})
    orm_epochs: float = field(default=1.0, metadata={"help": "autopsv: ORM training epochs."})
    orm_learning_rate: float = field(default=1e-3, metadata={"help": "autopsv: ORM learning rate."})
    orm_batch_size: int = field(default=16, metadata={"help": "autopsv: ORM batch size per device."})
    orm_max_steps: int = field(default=-1, metadata={"help": "autopsv: ORM optimizer steps (-1: by epochs)."})
    orm_lora: bool = field(default=False, metadata={"help": "autopsv: train the ORM as a LoRA adapter."})
    chat_template: bool = field(default=True, metadata={"help": "Prompt the policy through its tokenizer's chat "
                                                                "template when it has one (false: plain prompts)."})
    overwrite: bool = field(default=False, metadata={"help": "Delete an existing output instead of resuming."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bar."})

    def validate(self) -> None:
        if self.method not in METHODS:
            raise AnnotationError(f"--method must be one of {METHODS}, got {self.method!r}")
        positive = ("batch_size", "gen_batch_size", "max_new_tokens", "step_max_new_tokens", "max_depth",
                    "paths_per_problem", "rollouts")
        for name in positive:
            if getattr(self, name) < 1:
                raise AnnotationError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name in ("temperature_pos", "temperature_neg", "temperature"):
            if getattr(self, name) < 0:
                raise AnnotationError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.n is not None and self.n < 0:
            raise AnnotationError(f"--n must be >= 0, got {self.n}")
        if not 0.0 < self.orm_train_fraction < 1.0:
            raise AnnotationError(f"--orm_train_fraction must be in (0, 1), got {self.orm_train_fraction}")

    def settings(self) -> dict[str, Any]:
        """What decides the rows (checked when resuming); not paths, batch sizes or display."""
        skip = {"out", "n", "batch_size", "gen_batch_size", "overwrite", "disable_tqdm", "orm_dir"}
        if self.chat_template:  # recorded only when off, so files from before the flag still resume
            skip.add("chat_template")
        skip.update(name for name in ("question_column", "answer_column", "allow_test_split") if not getattr(self, name))
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


# ----------------------------------------------------------------------------------------------
# labelling rules (pure functions)


def exact_labels(problem: Problem | dict, steps: Sequence[str]) -> list[float]:
    """1.0 for every step before the world checker's earliest error, 0.0 from it on."""
    first_wrong = earliest_error(problem, list(steps))
    if first_wrong == -1:
        first_wrong = len(steps)
    return [1.0 if k < first_wrong else 0.0 for k in range(len(steps))]


def mc_label(hits: Sequence[bool], hard: bool = False) -> float:
    """Math-Shepherd's label of a prefix from its rollouts: fraction right (soft) or any right (hard)."""
    if not hits:
        raise ValueError("a Monte-Carlo label needs at least one rollout")
    return float(any(hits)) if hard else sum(map(bool, hits)) / len(hits)


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
class TreeNode:
    """A node of StepCo's annotation tree: one step (None at the root) and its continuations."""

    step: str | None = None
    children: list[TreeNode] = field(default_factory=list)
    correct: bool = False
    """For a leaf: whether its answer is the gold one."""
    status: str = "open"
    """answer, capped, truncated or dead_end for a leaf; open while it may still grow."""


def _leaf_counts(node: TreeNode, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(leaves, correct leaves) of the subtree at `node`, the node itself counting when a leaf."""
    key = id(node)
    if key not in memo:
        if not node.children:
            memo[key] = (1, int(node.correct))
        else:
            counts = [_leaf_counts(child, memo) for child in node.children]
            memo[key] = (sum(c[0] for c in counts), sum(c[1] for c in counts))
    return memo[key]


def tree_paths(root: TreeNode) -> list[tuple[list[str], list[float], TreeNode]]:
    """Every root-to-leaf path as (steps, labels, leaf), depth first with children in order.

    A step's label is the fraction of correct leaves in its subtree. A root without children
    gives no path (the root is the question, not a step).
    """
    memo: dict[int, tuple[int, int]] = {}
    out: list[tuple[list[str], list[float], TreeNode]] = []
    stack: list[tuple[TreeNode, list[str], list[float]]] = [(child, [], []) for child in reversed(root.children)]
    while stack:
        node, steps, labels = stack.pop()
        leaves, correct = _leaf_counts(node, memo)
        steps, labels = steps + [node.step or ""], labels + [correct / leaves]
        if not node.children:
            out.append((steps, labels, node))
        for child in reversed(node.children):
            stack.append((child, steps, labels))
    return out


# ----------------------------------------------------------------------------------------------
# sampling


def derive_seed(*parts: Any) -> int:
    """A generate call's seed from the run's seed and where the call is (stable across runs)."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()
    return int(digest[:8], 16) % (2**31)


@dataclass
class RunStats:
    """Counts of this run: generated tokens and bad generations."""

    generated_tokens: int = 0
    generate_calls: int = 0
    counts: Counter = field(default_factory=Counter)
    """Events by name; those in BAD_GENERATIONS are reported as bad generations."""

    def count(self, name: str, k: int = 1) -> None:
        if k:
            self.counts[name] += int(k)

    def generate(self, generator: Generator, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        outputs = generator.generate(prompts, params)
        if len(outputs) != len(prompts) or any(len(o) != params.n for o in outputs):
            raise RuntimeError(f"the generator returned {len(outputs)} lists for {len(prompts)} prompts")
        self.generate_calls += 1
        self.generated_tokens += sum(c.completion_tokens for o in outputs for c in o)
        return outputs


@dataclass
class SampledPath:
    steps: list[str]
    correct: bool
    answered: bool
    truncated: bool


def sample_paths(
    generator: Generator, problems: Sequence[Problem], cfg: AnnotateConfig, seed: int, stats: RunStats
) -> list[list[SampledPath]]:
    """`paths_per_problem` full paths per problem; paths with no step are counted and dropped."""
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                            n=cfg.paths_per_problem, seed=seed)
    outputs = stats.generate(generator, [solve_prompt(p.question) for p in problems], params)
    result = []
    for problem, completions in zip(problems, outputs):
        paths = []
        for c in completions:
            steps = split_steps(c.text).steps
            truncated = c.finish_reason == "length"
            answered = has_answer(c.text)
            stats.count("path_truncated", truncated)
            stats.count("path_no_answer", not answered)
            if not steps:
                stats.count("path_no_steps")
                continue
            paths.append(SampledPath(steps, answered and grade(c.text, problem).correct, answered, truncated))
        result.append(paths)
    return result


def _row(problem: Problem, method: str, k: int, steps: list[str], labels: list[float], correct: bool,
         **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": f"{problem.id}/{method}/{k}",
        "problem_id": problem.id,
        "prompt": problem.question,
        "completions": list(steps),
        "labels": [float(x) for x in labels],
        "method": method,
        "answer_correct": bool(correct),
    }
    if "world" in problem.meta:
        row["exact_labels"] = exact_labels(problem, steps)
    row.update(extra)
    return row


# ----------------------------------------------------------------------------------------------
# methods: each annotates one group of problems and returns its rows per problem id


def _first_step(completion: Completion) -> tuple[str | None, bool]:
    """(the step a one-step generation wrote or None, whether the token limit cut it)."""
    steps = split_steps(completion.text).steps
    truncated = completion.finish_reason == "length" and CLOSE_TAG not in completion.text
    return (steps[0] if steps else None), truncated


def grow_trees(generator: Generator, problems: Sequence[Problem], cfg: AnnotateConfig, group: int,
               stats: RunStats) -> list[TreeNode]:
    """StepCo's annotation trees of a group of problems, grown level by level."""
    roots = [TreeNode() for _ in problems]
    frontier: list[tuple[int, TreeNode, list[str]]] = [(i, root, []) for i, root in enumerate(roots)]
    depth = 0
    while frontier:
        depth += 1
        calls = []
        for kind, make_prompt, temperature in (("pos", solve_prompt, cfg.temperature_pos),
                                               ("neg", explore_prompt, cfg.temperature_neg)):
            params = SamplingParams(max_new_tokens=cfg.step_max_new_tokens, temperature=temperature, n=1,
                                    stop=STEP_STOP, seed=derive_seed(cfg.seed, "tree", group, depth, kind))
            prompts = [make_prompt(problems[i].question, prefix) for i, _, prefix in frontier]
            calls.append(stats.generate(generator, prompts, params))
        next_frontier = []
        for (i, node, prefix), (pos,), (neg,) in zip(frontier, *calls):
            seen: set[str] = set()
            for completion in (pos, neg):
                step, truncated = _first_step(completion)
                if step is None:
                    stats.count("step_empty")
                    continue
                if step in seen:
                    stats.count("duplicate_steps_merged")
                    continue
                seen.add(step)
                child = TreeNode(step)
                node.children.append(child)
                if has_answer(step):
                    child.status, child.correct = "answer", answer_correct(step, problems[i])
                elif truncated:
                    child.status = "truncated"
                elif depth >= cfg.max_depth:
                    child.status = "capped"
                else:
                    next_frontier.append((i, child, prefix + [step]))
                if child.status != "open":
                    stats.count(f"leaf_{child.status}")
            if not node.children and node.step is not None:
                node.status = "dead_end"
                stats.count("leaf_dead_end")
        frontier = next_frontier
    return roots


def annotate_tree(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
    out = {}
    for problem, root in zip(problems, grow_trees(generator, problems, cfg, group, stats)):
        paths = tree_paths(root)
        if not paths:
            stats.count("problem_no_paths")
        out[problem.id] = [_row(problem, "tree", k, steps, labels, leaf.correct)
                           for k, (steps, labels, leaf) in enumerate(paths)]
    return out


def annotate_mc(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
    sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
    prefixes: dict[tuple[int, tuple[str, ...]], int] = {}
    for i, paths in enumerate(sampled):
        for path in paths:
            for end in range(1, len(path.steps)):
                prefixes.setdefault((i, tuple(path.steps[:end])), len(prefixes))
    keys = list(prefixes)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, n=cfg.rollouts,
                            seed=derive_seed(cfg.seed, "rollouts", group))
    prompts = [solve_prompt(problems[i].question, list(prefix)) for i, prefix in keys]
    outputs = stats.generate(generator, prompts, params)
    hits: dict[tuple[int, tuple[str, ...]], list[bool]] = {}
    for (i, prefix), completions in zip(keys, outputs):
        # the prefix counts too: a rollout from a prefix that already answered may not repeat it
        done_text = prefix_text(list(prefix))
        hits[(i, prefix)] = [answer_correct(done_text + c.text, problems[i]) for c in completions]
        stats.count("rollout_no_answer", sum(not has_answer(done_text + c.text) for c in completions))
        stats.count("rollout_truncated", sum(c.finish_reason == "length" for c in completions))
    out = {}
    for i, (problem, paths) in enumerate(zip(problems, sampled)):
        rows = []
        for k, path in enumerate(paths):
            labels = [mc_label(hits[(i, tuple(path.steps[:end]))], cfg.hard) for end in range(1, len(path.steps))]
            rows.append(_row(problem, "mc", k, path.steps, labels + [float(path.correct)], path.correct))
        out[problem.id] = rows
    return out


def _labelled_samples(method: str, label: Callable[[Problem, SampledPath], list[float]]):
    """A method that labels each sampled path (no rollout) with `label(problem, path)`."""

    def annotate_samples(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
        sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
        return {
            problem.id: [_row(problem, method, k, p.steps, label(problem, p), p.correct)
                         for k, p in enumerate(paths)]
            for problem, paths in zip(problems, sampled)
        }

    return annotate_samples


annotate_exact = _labelled_samples("exact", lambda problem, p: exact_labels(problem, p.steps))
annotate_outcome = _labelled_samples("outcome", lambda problem, p: [float(p.correct)] * len(p.steps))


def _score_paths(verifier, questions: list[str], paths: list[list[str]], stats: RunStats) -> list[list[float] | None]:
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
                train_fn: Callable[..., str] | None = None, verifier_factory: Callable[[str], Any] | None = None,
                ) -> OrmInfo:
    """Train AutoPSV's outcome verifier, or reuse the one already in the ORM directory.

    The directory is written under a temporary name and renamed when complete, so a killed run
    leaves no half-trained model that a later run would reuse.
    """
    orm_dir = Path(cfg.orm_dir or f"{cfg.out}.orm")
    info_path = orm_dir / "autopsv.json"
    if info_path.exists():
        info = json.loads(info_path.read_text())
        if info.get("settings") != _orm_settings(cfg):
            raise AnnotationError(f"{orm_dir} was trained with other settings ({info.get('settings')}); "
                                  "remove it or choose --orm_dir")
        model_path = info["model_path"]
        if not Path(model_path).is_absolute():
            model_path = str(orm_dir / model_path)
        return OrmInfo(model_path, info["baseline"], info["train_problem_ids"], info["train_paths"],
                       info["train_correct"], reused=True)
    if orm_dir.exists():
        raise AnnotationError(f"{orm_dir} exists but holds no autopsv.json; remove it or choose --orm_dir")
    if train_fn is None:
        from reward_models.train import train_verifier as train_fn
    if verifier_factory is None:
        from reward_models.psv import PSVVerifier

        verifier_factory = PSVVerifier.from_pretrained
    train_ids = set(orm_split([p.id for p in problems], cfg.orm_train_fraction, cfg.seed))
    train_problems = [p for p in problems if p.id in train_ids]
    questions, paths, rows = [], [], []
    for start in _progress(range(0, len(train_problems), cfg.batch_size), cfg, "autopsv: ORM paths"):
        group = train_problems[start : start + cfg.batch_size]
        sampled = sample_paths(generator, group, cfg, derive_seed(cfg.seed, "orm_paths", start // cfg.batch_size),
                               stats)
        for problem, problem_paths in zip(group, sampled):
            for k, path in enumerate(problem_paths):
                questions.append(problem.question)
                paths.append(path.steps)
                rows.append({"id": f"{problem.id}/orm/{k}", "problem_id": problem.id, "prompt": problem.question,
                             "completions": path.steps, "labels": [float(path.correct)] * len(path.steps),
                             "answer_correct": path.correct})
    if not rows:
        raise AnnotationError("autopsv: the policy wrote no path with a step for the ORM-training problems")
    tmp = orm_dir.with_name(orm_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        returned = train_fn(rows, init_from=cfg.policy, output_dir=str(tmp), loss="mse", outcome_only=True,
                            lora=cfg.orm_lora, num_train_epochs=cfg.orm_epochs, learning_rate=cfg.orm_learning_rate,
                            per_device_train_batch_size=cfg.orm_batch_size, seed=cfg.seed,
                            max_steps=cfg.orm_max_steps, skip_bad_rows=True)
    except ValueError as err:  # e.g. no trainable row
        raise AnnotationError(f"autopsv: training the ORM in {tmp} failed: {err}") from err
    returned = Path(returned or tmp).resolve()
    try:
        relative = str(returned.relative_to(tmp.resolve()))
    except ValueError:
        relative = None
    scores = _score_paths(verifier_factory(str(returned)), questions, paths, stats)
    firsts = [s[0] for s in scores if s]
    if not firsts:
        raise AnnotationError("autopsv: the ORM could score none of its training paths")
    info = {
        "model_path": relative if relative is not None else str(returned),
        "baseline": sum(firsts) / len(firsts),
        "train_problem_ids": sorted(train_ids, key=[p.id for p in problems].index),
        "train_paths": len(rows),
        "train_correct": sum(r["answer_correct"] for r in rows),
        "settings": _orm_settings(cfg),
    }
    with (tmp / "orm_train_rows.jsonl").open("w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    (tmp / "autopsv.json").write_text(json.dumps(info, indent=2))
    os.replace(tmp, orm_dir)
    model_path = str(orm_dir / relative) if relative is not None else str(returned)
    return OrmInfo(model_path, info["baseline"], info["train_problem_ids"], info["train_paths"],
                   info["train_correct"])


def _orm_settings(cfg: AnnotateConfig) -> dict[str, Any]:
    names = ("policy", "data", "split", "seed", "paths_per_problem", "temperature", "max_new_tokens",
             "orm_train_fraction", "orm_epochs", "orm_learning_rate", "orm_batch_size", "orm_max_steps", "orm_lora")
    return {name: getattr(cfg, name) for name in names}


def make_autopsv(orm: OrmInfo, verifier_factory: Callable[[str], Any]) -> Callable[..., dict[str, list[dict]]]:
    """AutoPSV's labelling of a group; the ORM is loaded on first use (a finished run never loads it)."""
    loaded: list[Any] = []

    def annotate_autopsv(generator, problems, cfg, group, stats) -> dict[str, list[dict]]:
        if not loaded:
            loaded.append(verifier_factory(orm.model_path))
        verifier = loaded[0]
        sampled = sample_paths(generator, problems, cfg, derive_seed(cfg.seed, "paths", group), stats)
        flat = [(i, k, path) for i, paths in enumerate(sampled) for k, path in enumerate(paths)]
        scores = _score_paths(verifier, [problems[i].question for i, _, _ in flat], [p.steps for _, _, p in flat],
                              stats)
        out: dict[str, list[dict]] = {p.id: [] for p in problems}
        for (i, k, path), path_scores in zip(flat, scores):
            if path_scores is None:
                continue
            labels = autopsv_labels(path_scores, orm.baseline, cfg.drop_threshold)
            out[problems[i].id].append(_row(problems[i], "autopsv", k, path.steps, labels, path.correct,
                                            orm_scores=[float(s) for s in path_scores]))
        return out

    return annotate_autopsv


# ----------------------------------------------------------------------------------------------
# resumable output


def _read_jsonl_tolerant(path: Path) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, row) of every complete line, and whether a trailing partial line was dropped;
    a bad line anywhere else raises AnnotationError naming the file and line."""
    return read_resumable_jsonl(path, AnnotationError, "remove the file or pass --overwrite")


class ResumableWriter:
    """Appends the rows of one problem at a time, then records the problem as done."""

    def __init__(self, out: str | os.PathLike[str], settings: dict[str, Any], overwrite: bool = False):
        self.out = Path(out)
        self.done_path = self.out.with_name(self.out.name + ".done")
        self.meta_path = self.out.with_name(self.out.name + ".meta.json")
        self.settings = settings
        if overwrite:
            for p in (self.out, self.done_path, self.meta_path):
                p.unlink(missing_ok=True)
        self.done: dict[str, int] = {}
        self.dropped_rows = 0
        self.dropped_partial_lines = 0
        self._recover()
        self._rows_fh = self.out.open("a")
        self._done_fh = self.done_path.open("a")

    def _recover(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if self.meta_path.exists():
            old = json.loads(self.meta_path.read_text())
            if old != json.loads(json.dumps(self.settings)):
                changed = sorted(k for k in set(old) | set(self.settings) if old.get(k) != self.settings.get(k))
                raise AnnotationError(f"{self.out} was written with other settings ({', '.join(changed)}); "
                                      "pass --overwrite or choose another --out")
        elif self.out.exists() and self.out.stat().st_size > 0:
            raise AnnotationError(f"{self.out} exists but has no {self.meta_path.name}; pass --overwrite")
        else:
            self.meta_path.write_text(json.dumps(self.settings, indent=2))
        done_rows, done_partial = _read_jsonl_tolerant(self.done_path)
        recorded: dict[str, int] = {}
        for lineno, entry in done_rows:
            if not isinstance(entry.get("problem_id"), str) or not isinstance(entry.get("rows"), int):
                raise AnnotationError(f"{self.done_path}:{lineno}: expected {{'problem_id': str, 'rows': int}}")
            recorded[entry["problem_id"]] = entry["rows"]
        rows, rows_partial = _read_jsonl_tolerant(self.out)
        by_problem: dict[str, list[dict]] = {}
        for lineno, row in rows:
            if not isinstance(row.get("problem_id"), str) or not isinstance(row.get("id"), str):
                raise AnnotationError(f"{self.out}:{lineno}: row without a string 'id' and 'problem_id'")
            by_problem.setdefault(row["problem_id"], []).append(row)
        for pid, n in recorded.items():
            got = by_problem.get(pid, [])
            if len(got) == n and len({r["id"] for r in got}) == n:
                self.done[pid] = n
        keep = [row for _, row in rows if row["problem_id"] in self.done]
        self.dropped_rows = len(rows) - len(keep)
        self.dropped_partial_lines = int(rows_partial)
        if self.dropped_rows or rows_partial:
            write_jsonl(self.out, keep)
        if done_partial or len(self.done) != len(done_rows):
            write_jsonl(self.done_path, ({"problem_id": p, "rows": n} for p, n in self.done.items()))

    def write_problem(self, problem_id: str, rows: list[dict]) -> None:
        self._rows_fh.write("".join(json.dumps(r) + "\n" for r in rows))
        self._rows_fh.flush()
        os.fsync(self._rows_fh.fileno())
        self._done_fh.write(json.dumps({"problem_id": problem_id, "rows": len(rows)}) + "\n")
        self._done_fh.flush()
        os.fsync(self._done_fh.fileno())
        self.done[problem_id] = len(rows)

    def close(self) -> None:
        self._rows_fh.close()
        self._done_fh.close()


# ----------------------------------------------------------------------------------------------
# driver


def _progress(iterable, cfg: AnnotateConfig, desc: str, total: int | None = None):
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, disable=cfg.disable_tqdm, dynamic_ncols=True)


class _LazyHFGenerator:
    """The policy through the `hf` backend, loaded on the first generate call (a finished run never loads it)."""

    def __init__(self, path: str, batch_size: int, chat_template: bool = True):
        self.path, self.batch_size, self.chat_template, self._generator = path, batch_size, chat_template, None
        self._tokenizer = None

    def _tok(self):
        """The policy's tokenizer alone (no weights), for the context check before any generation."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        return self._tokenizer

    @property
    def context_length(self) -> int | None:
        from transformers import AutoConfig

        from inference.backends.prompt_limits import context_of

        return context_of(AutoConfig.from_pretrained(self.path))

    @property
    def max_token_chars(self) -> int | None:
        from inference.backends.prompt_limits import max_token_chars

        return max_token_chars(self._tok())

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._tok()(list(texts), add_special_tokens=False)["input_ids"]]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if self._generator is None:
            from inference.backends.hf import HFGenerator

            self._generator = HFGenerator.from_pretrained(self.path, batch_size=self.batch_size,
                                                          chat_template=self.chat_template)
        return self._generator.generate(prompts, params)


def load_problems(cfg: AnnotateConfig) -> list[Problem]:
    """The problems to annotate: world problems (with the policy's world config if it saved one) or
    any dataset of `reasoning.problem_sets`; its labels train a verifier, so a test split is refused
    unless --allow_test_split."""
    from reasoning.problem_sets import WorldDraw, check_training_split, load_problem_set

    world = WorldDraw(split=cfg.split, n=100 if cfg.n is None else cfg.n, seed=cfg.seed,
                      config=world_config_of(cfg.policy))
    loaded = load_problem_set(cfg.data, role="train", limit=None if cfg.data == "world" else cfg.n, world=world,
                              question_column=cfg.question_column, answer_column=cfg.answer_column)
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
        print(f"--data {cfg.data}: {left_out} of {len(problems)} problems left out, {PROMPT_TOO_LONG} (the prompt and "
              f"--max_new_tokens {cfg.max_new_tokens} exceed the policy's {context}-token context; first: {first!r})",
              file=sys.stderr)
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
        if world is not None and not (isinstance(world, dict) and "quantities" in world and "target" in world):
            raise AnnotationError(f"problem {p.id!r}: field 'world' is not a world description")
        if cfg.method == "exact" and world is None:
            raise AnnotationError(f"--method exact needs world problems; problem {p.id!r} has no 'world' field")


def summarize(out: Path) -> dict[str, Any]:
    """Counts, the mean label and (for world rows) the agreement with exact labels, over the file."""
    rows = steps = correct = 0
    label_sum = 0.0
    exact_steps = 0
    abs_err = 0.0
    agree = 0
    problems: set[str] = set()
    with out.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            rows += 1
            problems.add(row["problem_id"])
            correct += bool(row["answer_correct"])
            steps += len(row["labels"])
            label_sum += sum(row["labels"])
            if "exact_labels" in row:
                for label, exact in zip(row["labels"], row["exact_labels"]):
                    exact_steps += 1
                    abs_err += abs(label - exact)
                    agree += (label >= 0.5) == (exact >= 0.5)
    summary: dict[str, Any] = {
        "problems_with_rows": len(problems),
        "rows": rows,
        "steps": steps,
        "mean_label": label_sum / steps if steps else None,
        "answer_correct_rate": correct / rows if rows else None,
    }
    if exact_steps:
        summary["agreement"] = {"steps": exact_steps, "mae": abs_err / exact_steps, "accuracy": agree / exact_steps}
    return summary


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
    if generator is None:  # the policy loads on first use: a bad path is named now, in one line
        from inference.backends.model_files import check_model_path

        try:
            check_model_path("--policy", cfg.policy)
        except ValueError as err:
            raise AnnotationError(str(err)) from None
        generator = _LazyHFGenerator(cfg.policy, cfg.gen_batch_size, cfg.chat_template)
    problems, too_long = _problems_that_fit(generator, problems, cfg)
    writer = ResumableWriter(cfg.out, cfg.settings(), overwrite=cfg.overwrite)
    stats = RunStats()
    extra: dict[str, Any] = {PROMPT_TOO_LONG: too_long}
    try:
        method: Callable[..., dict[str, list[dict]]]
        if cfg.method == "autopsv":
            orm = prepare_orm(generator, problems, cfg, stats, train_fn, verifier_factory)
            if verifier_factory is None:
                from reward_models.psv import PSVVerifier

                verifier_factory = PSVVerifier.from_pretrained
            train_ids = set(orm.train_problem_ids)
            problems = [p for p in problems if p.id not in train_ids]
            method = make_autopsv(orm, verifier_factory)
            extra["orm"] = {"dir": str(Path(cfg.orm_dir or f"{cfg.out}.orm")), "model": orm.model_path,
                            "reused": orm.reused, "train_problems": len(train_ids), "train_paths": orm.train_paths,
                            "train_correct": orm.train_correct, "baseline": orm.baseline}
        else:
            method = {"tree": annotate_tree, "mc": annotate_mc, "exact": annotate_exact,
                      "outcome": annotate_outcome}[cfg.method]
        skipped = sum(p.id in writer.done for p in problems)
        bar = _progress(None, cfg, cfg.method, total=len(problems) - skipped)
        annotated = 0
        for g, start_index in enumerate(range(0, len(problems), cfg.batch_size)):
            group = problems[start_index : start_index + cfg.batch_size]
            todo = [p for p in group if p.id not in writer.done]
            if not todo:
                continue
            # the whole group is sampled again (same seeds, same batch) so a resumed run matches
            rows_by_problem = method(generator, group, cfg, g, stats)
            for problem in todo:
                writer.write_problem(problem.id, rows_by_problem.get(problem.id, []))
            annotated += len(todo)
            bar.update(len(todo))
        bar.close()
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


class NoAnnotatedPaths(ValueError):
    """An annotation that gave no stepwise row to train on."""


def train_on_annotation(annotate_config, output_dir: str, log=None, **train_args) -> tuple[list[dict], dict]:
    """A PSV from the policy's own paths: annotate them (`reward_models.annotate`, appending to
    `annotate_config.out`, so an interrupted annotation resumes), read the stepwise rows back, and
    train on them from `annotate_config.policy` into `output_dir` (`train_verifier`'s keywords).
    `log(message)` hears when training starts. Returns the rows and the annotation's summary;
    NoAnnotatedPaths when the annotation gave no path."""
    from reward_models.train import train_verifier

    summary = annotate(annotate_config)
    rows_path = Path(annotate_config.out)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise NoAnnotatedPaths(f"the annotation of {annotate_config.n} problems gave no paths (see "
                         f"{rows_path}.summary.json)")
    if log is not None:
        log(f"training the PSV on {len(rows)} annotated paths into {output_dir}")
    train_verifier(rows, init_from=annotate_config.policy, output_dir=output_dir, **train_args)
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    parser = TrlParser((AnnotateConfig,))
    (cfg,) = parser.parse_args_and_config(args=argv)
    try:
        summary = annotate(cfg)
    except (AnnotationError, DatasetError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
