"""Core types: a problem, a reasoning path."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ANSWER_KINDS = ("number", "latex", "choice", "text", "none")


@dataclass
class Problem:
    """One problem of a benchmark or of the arithmetic world."""

    id: str
    """Unique within its dataset."""
    question: str
    """The problem text shown to a model."""
    answer: str
    """Gold final answer as text; "" when the dataset has none (ProcessBench)."""
    answer_kind: str = "number"
    """How the answer is graded: one of ANSWER_KINDS."""
    options: list[str] | None = None
    """Multiple-choice options ("A)...", ...) for `choice` problems."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Every other field of the source row, kept verbatim (e.g. `steps`, `label`, `world`)."""

    def __post_init__(self) -> None:
        if self.answer_kind not in ANSWER_KINDS:
            raise ValueError(f"answer_kind must be one of {ANSWER_KINDS}, got {self.answer_kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReasoningPath:
    """A model's solution split into steps, plus its extracted final answer."""

    steps: list[str]
    """Step texts without the <Step> tags, in order."""
    answer: str | None = None
    """The extracted final answer, or None when none could be found."""
    raw: str | None = None
    """The text the steps came from, when the path was parsed from model output."""
    segmentation: str = "tags"
    """How the steps were found: tags, unclosed_tags, blank_lines, lines, whole, empty."""

    @property
    def num_steps(self) -> int:
        return len(self.steps)
