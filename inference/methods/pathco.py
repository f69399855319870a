"""PathCo: StepCo's path-level ablation, revising the whole path instead of its rejected steps.

From Wu et al. 2024, "Enhancing Mathematical Reasoning in LLMs by Stepwise Correction", where it
isolates the value of stepwise correction: the same verify-then-revise loop as StepCo
(`stepco.verify_and_revise`), but a path is judged as a whole, by the aggregate of its step
scores (the mean, as in the paper), and when that falls below θ the WHOLE path is regenerated:

- `revision="prompt"`: `revise_prompt` with step_index 1 ("revise steps 1 onward while keeping no
  steps"), reporting the path's aggregate score as the probability;
- `revision="resample"`: a fresh sample of `solve_prompt` at `resample_temperature`.

Up to `max_rounds` rounds; the prediction is the last path's answer. The trace has StepCo's
shape (`rounds` of `{round, steps, scores, revised_index}`, revised_index always 1 for a
revision; `stopped`; `revisions`), and the flags are StepCo's.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.methods.base import MethodOutput, Tracker
from inference.methods.stepco import RevisionConfig, verify_and_revise
from reasoning.types import Problem
from reward_models.verifier import AGGREGATIONS, aggregate


@dataclass
class Config(RevisionConfig):
    """PathCo's settings: the loop's (θ applied to the path's aggregate score), and the aggregation."""

    aggregation: str = "mean"
    """How step scores become the path's score: mean (the paper's PathCo), min, prod or last."""

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        super().__post_init__()


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    def whole_path(scores: list[float], floor: int) -> tuple[int, float] | None:
        value = aggregate(scores, config.aggregation)
        return None if value >= (config.threshold if config.threshold is not None else 0.0) else (1, value)

    return verify_and_revise(problems, tracker, config, whole_path)
