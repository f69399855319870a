"""What one kind of problem adds to a training run, behind a narrow hook: the general code (the PPO
trainer, the greedy evaluation, the baselines beside PPO) calls `ProblemHooks`, and only this module
knows the arithmetic world's part of it.

- `error_kind(problem, steps)`: the kind of a greedy path's error, for the rows and the error mix of
  a greedy evaluation; None when the kind of problem has no classifier (or the path is right);
- `carry_files(source_policy, target_dir)`: files a model trained from `source_policy` keeps beside
  its weights (the world's settings, so that "its world" is the same problems).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reasoning.types import Problem
from reasoning.world import carry_world_files, error_kind


@dataclass(frozen=True)
class ProblemHooks:
    classifies: Callable[[Problem], bool] = lambda problem: False
    """Whether `error_kind` applies to a problem (its rows then carry an `error_kind`)."""
    error_kind: Callable[[Problem, list[str]], str | None] = lambda problem, steps: None
    """The kind of a path's first error, None for a right path."""
    carry_files: Callable[[str | Path | None, Path], list[str]] = lambda source, target: []
    """Copy what a trained model keeps from the policy it started from; the names copied."""


NO_HOOKS = ProblemHooks()
WORLD_HOOKS = ProblemHooks(classifies=lambda problem: "world" in problem.meta, error_kind=error_kind,
                           carry_files=carry_world_files)
"""The arithmetic world's: its error kinds, and its settings files (a no-op for other policies)."""
