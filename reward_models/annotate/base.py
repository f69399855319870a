"""What every annotation method shares: the settings, the one signature, counters, seeds and the row.

Each method is one module of this package (`tree`, `mc`, `autopsv`, `exact`, `outcome`) with an
`annotate_group` of the signature `GroupAnnotator`; the driver (`reward_models.annotate.run`) calls it
once per group of problems and writes what it returns.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from backends.base import Completion, Generator, SamplingParams
from reasoning.steps import ANSWER_MATCHES, check_answer_match
from reasoning.types import Problem
from reasoning.world import earliest_error

METHODS = ("tree", "mc", "autopsv", "exact", "outcome")
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
    data: str = field(default="world", metadata={"help": (
        "'world', a .jsonl/.json/.parquet/.csv file, a save_to_disk folder (FOLDER[:SPLIT], default train) "
        "or a Hub id (ID[:CONFIG]:SPLIT); a test split (a benchmark name, a file named *test*) needs "
        "--allow_test_split.")})
    n: int | None = field(default=None, metadata={"help": "Problems: world count (default 100), file limit."})
    split: str = field(default="train", metadata={"help": "World split for --data world."})
    question_column: str | None = field(default=None, metadata={
        "help": "Column of the question (default: the first of question, problem, prompt)."})
    answer_column: str | None = field(default=None, metadata={
        "help": "Column of the gold answer (default: the first of answer, solution, completion)."})
    allow_test_split: bool = field(default=False, metadata={
        "help": "Annotate a test split all the same (its labels train a verifier)."})
    seed: int = field(default=0, metadata={"help": "Seed of the world problems, sampling and ORM training."})
    batch_size: int = field(default=8, metadata={"help": "Problems annotated together (one generate call)."})
    gen_batch_size: int = field(default=64, metadata={"help": "Sequences per forward pass of the backend."})
    max_new_tokens: int = field(default=192, metadata={"help": "Token limit of a full path or a rollout."})
    step_max_new_tokens: int = field(default=64, metadata={"help": "Token limit of one step (tree)."})
    temperature_pos: float = field(default=0.7, metadata={
        "help": "tree: temperature of the positive prompt."})
    temperature_neg: float = field(default=1.0, metadata={
        "help": "tree: temperature of the exploratory prompt."})
    max_depth: int = field(default=8, metadata={"help": "tree: most steps on a path (deeper = capped leaf)."})
    paths_per_problem: int = field(default=4, metadata={
        "help": "mc/autopsv/exact/outcome: sampled paths per problem."})
    temperature: float = field(default=1.0, metadata={
        "help": "mc/autopsv/exact/outcome: sampling temperature."})
    rollouts: int = field(default=4, metadata={"help": "mc: completions sampled from each prefix."})
    hard: bool = field(default=False, metadata={"help": "mc: label 1.0 if any rollout is right (else soft)."})
    best_of: int = field(default=1, metadata={
        "help": "mc: K, label a prefix by the chance that one of K continuations is right (PAV's Best-of-K "
                "prover), the unbiased pass@K estimate from the --rollouts (plug-in below K); 1: the fraction."})
    answer_match: str = field(default="strict", metadata={
        "help": "The answer check of every label (a path's answer_correct, an mc rollout's hit): 'strict' counts "
                "only a stated answer (<ans>, 'answer is', \\boxed); 'flexible' also a trailing number, as "
                "inference.evaluate's headline accuracy does. The labels an outcome verifier or the implicit PRM "
                "learns from. A tree leaf that states no answer is wrong under both.", "choices": list(ANSWER_MATCHES)})
    orm_train_fraction: float = field(default=0.5, metadata={
        "help": "autopsv: share of problems training the ORM."})
    drop_threshold: float = field(default=-0.5, metadata={
        "help": "autopsv: relative score change marking a wrong step."})
    orm_dir: str | None = field(default=None, metadata={
        "help": "autopsv: ORM directory (default <out>.orm)."})
    orm_epochs: float = field(default=1.0, metadata={"help": "autopsv: ORM training epochs."})
    orm_learning_rate: float = field(default=1e-3, metadata={"help": "autopsv: ORM learning rate."})
    orm_batch_size: int = field(default=16, metadata={"help": "autopsv: ORM batch size per device."})
    orm_max_steps: int = field(default=-1, metadata={"help": "autopsv: ORM optimizer steps (-1: by epochs)."})
    orm_lora: bool = field(default=False, metadata={"help": "autopsv: train the ORM as a LoRA adapter."})
    chat_template: bool = field(default=True, metadata={
        "help": "Prompt the policy through its tokenizer's chat template when it has one (false: plain "
                "prompts)."})
    overwrite: bool = field(default=False, metadata={
        "help": "Delete an existing output instead of resuming."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bar."})

    def validate(self) -> None:
        if self.method not in METHODS:
            raise AnnotationError(f"--method must be one of {METHODS}, got {self.method!r}")
        positive = ("batch_size", "gen_batch_size", "max_new_tokens", "step_max_new_tokens", "max_depth",
                    "paths_per_problem", "rollouts", "best_of")
        for name in positive:
            if getattr(self, name) < 1:
                raise AnnotationError(f"--{name} must be >= 1, got {getattr(self, name)}")
        for name in ("temperature_pos", "temperature_neg", "temperature"):
            if getattr(self, name) < 0:
                raise AnnotationError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.n is not None and self.n < 0:
            raise AnnotationError(f"--n must be >= 0, got {self.n}")
        try:
            check_answer_match(self.answer_match)
        except ValueError as err:
            raise AnnotationError(str(err)) from None
        if self.best_of > 1 and self.method != "mc":
            raise AnnotationError(f"--best_of labels mc rollouts only, got --method {self.method}")
        if self.best_of > 1 and self.hard:
            raise AnnotationError("--best_of and --hard are two labels of the rollouts: give one")
        if not 0.0 < self.orm_train_fraction < 1.0:
            raise AnnotationError(f"--orm_train_fraction must be in (0, 1), got {self.orm_train_fraction}")

    def settings(self) -> dict[str, Any]:
        """What decides the rows (checked when resuming); not paths, batch sizes or display."""
        skip = {"out", "n", "batch_size", "gen_batch_size", "overwrite", "disable_tqdm", "orm_dir"}
        if self.chat_template:  # recorded only when off, so files from before the flag still resume
            skip.add("chat_template")
        if self.answer_match == "strict":  # likewise: recorded only when not the check files were made with
            skip.add("answer_match")
        if self.best_of == 1:  # likewise: files labelled before --best_of existed resume
            skip.add("best_of")
        skip.update(name for name in ("question_column", "answer_column", "allow_test_split")
                    if not getattr(self, name))
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


GroupAnnotator = Callable[[Generator, Sequence[Problem], "AnnotateConfig", int, "RunStats"],
                          dict[str, list[dict]]]
"""The one signature of an annotation method, `annotate_group(generator, problems, cfg, group, stats)`:
the rows of one group of problems (`cfg.batch_size` of them, sampled together), by problem id. `group`
is the group's index, from which its generate calls derive their seeds (`derive_seed`), so a resumed
run samples a group exactly as an uninterrupted one; `stats` counts tokens and bad generations."""


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

    def generate(self, generator: Generator, prompts: list[str], params: SamplingParams,
                 ) -> list[list[Completion]]:
        if not prompts:
            return []
        outputs = generator.generate(prompts, params)
        if len(outputs) != len(prompts) or any(len(o) != params.n for o in outputs):
            raise RuntimeError(f"the generator returned {len(outputs)} lists for {len(prompts)} prompts")
        self.generate_calls += 1
        self.generated_tokens += sum(c.completion_tokens for o in outputs for c in o)
        return outputs


def exact_labels(problem: Problem | dict, steps: Sequence[str]) -> list[float]:
    """1.0 for every step before the world checker's earliest error, 0.0 from it on."""
    first_wrong = earliest_error(problem, list(steps))
    if first_wrong == -1:
        first_wrong = len(steps)
    return [1.0 if k < first_wrong else 0.0 for k in range(len(steps))]


def make_row(problem: Problem, method: str, k: int, steps: list[str], labels: list[float], correct: bool,
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


def progress(iterable, cfg: AnnotateConfig, desc: str, total: int | None = None):
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, disable=cfg.disable_tqdm, dynamic_ncols=True)
