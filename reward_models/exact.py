"""The `exact` verifier for world problems: the world's step checker, as a `Verifier`.

An **upper reference**, not a method: it reads the problem's quantities (everything a perfect
reader of the question would know), never the gold answer string, and returns 1.0 for every step
up to the first wrong one and 0.0 from there on. Use it to measure a mechanism (StepCo's
revision, PPO's credit assignment) separately from verifier quality.
"""

from __future__ import annotations

from collections.abc import Sequence

from reasoning.world import earliest_error
from reward_models.verifier import UnknownQuestionError, validate_paths


class ExactVerifier:
    def __init__(self, problems_by_question: dict[str, dict]):
        """`problems_by_question` maps a question text to its world row (with the `world` field)."""
        self.problems = problems_by_question
        self.tokens_used = 0

    @classmethod
    def from_rows(cls, rows: Sequence[dict]) -> ExactVerifier:
        return cls({r["question"]: r for r in rows})

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        out = []
        for i, (question, steps) in enumerate(zip(questions, paths)):
            row = self.problems.get(question)
            if row is None:
                raise UnknownQuestionError(f"row {i}: the exact verifier knows only world problems; question not found")
            first_wrong = earliest_error(row, list(steps))
            if first_wrong == -1:
                first_wrong = len(steps)
            out.append([1.0 if k < first_wrong else 0.0 for k in range(len(steps))])
        return out
