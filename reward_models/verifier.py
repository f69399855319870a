"""The one `Verifier` interface: PPO rewards, Best-of-N selection and StepCo's verification all call it.

A verifier maps a question and a reasoning path (a list of steps) to one probability per step: the
probability that the path so far leads to the correct answer. Model-based verifiers compute all
steps of a path in **one forward pass**, reading each step's score at the position of its last
token, and batch paths together.

This module holds what every backend shares: the protocol, the text layout a path is scored in
(the policy's solve prompt followed by the tagged steps), the mapping from step ends to token
positions through character offsets, input validation, and token accounting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reasoning.prompts import solve_prompt
from reasoning.steps import CLOSE_TAG, join_steps


class VerifierInputError(ValueError):
    """A path a verifier cannot score (no steps, an empty step, longer than the model's context)."""


class UnknownQuestionError(VerifierInputError, KeyError):
    """A question a verifier built from known problems (the world's exact checker) does not know.
    A KeyError too, as a lookup that failed."""

    __str__ = ValueError.__str__  # the message as given, not quoted as a KeyError's key


@runtime_checkable
class Verifier(Protocol):
    tokens_used: int
    """Tokens this verifier has read so far (prompt and steps), for honest compute accounting."""

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        """For each (question, steps) pair, one probability in [0, 1] per step."""
        ...


@dataclass
class ScoringLayout:
    text: str
    """The prompt and the tagged steps, as the verifier reads them."""
    step_end_chars: list[int]
    """For each step, the index of the last character of its closing tag in `text`."""


def layout(question: str, steps: Sequence[str]) -> ScoringLayout:
    """The text a path is scored in and where each step ends, in characters."""
    text = solve_prompt(question)
    ends = []
    for step in steps:
        text += join_steps([step])
        ends.append(len(text) - 1)
        text += "\n"
    # Every step, the last included, is followed by the same newline, so a step's tokens (and
    # its score) do not depend on whether another step follows it.
    return ScoringLayout(text=text, step_end_chars=ends)


def validate_paths(questions: Sequence[str], paths: Sequence[Sequence[str]]) -> None:
    """Clear errors, naming the row, for inputs no verifier can score."""
    if len(questions) != len(paths):
        raise VerifierInputError(f"{len(questions)} questions but {len(paths)} paths")
    for i, (question, steps) in enumerate(zip(questions, paths)):
        if not isinstance(question, str):
            raise VerifierInputError(f"row {i}: question is {type(question).__name__}, not str")
        if isinstance(steps, str):
            raise VerifierInputError(f"row {i}: steps must be a list of strings, got one string")
        if len(steps) == 0:
            raise VerifierInputError(f"row {i}: the path has zero steps")
        for j, step in enumerate(steps):
            if not isinstance(step, str) or not step.strip():
                raise VerifierInputError(f"row {i}: step {j} is empty or not a string")
            if CLOSE_TAG in step or "<Step>" in step:
                raise VerifierInputError(f"row {i}: step {j} contains a step tag")


def token_positions(offsets: Sequence[tuple[int, int]], char_positions: Sequence[int]) -> list[int]:
    """Index of the token covering each character position (offsets from a fast tokenizer).

    Works whatever the tokenizer: the verifier's tokenizer need not be the policy's, and a closing
    tag may be split over several tokens (the token holding its last character is used).
    """
    out = []
    t = 0
    for pos in char_positions:
        while t < len(offsets) and not (offsets[t][0] <= pos < offsets[t][1]):
            if offsets[t][0] > pos:
                break
            t += 1
        if t >= len(offsets) or not (offsets[t][0] <= pos < offsets[t][1]):
            # Fall back to the last token that starts at or before the position.
            candidates = [k for k, (s, e) in enumerate(offsets) if s <= pos and e > s]
            if not candidates:
                raise VerifierInputError(f"no token covers character {pos}")
            t = candidates[-1]
        out.append(t)
    return out


AGGREGATIONS = ("mean", "min", "prod", "last")


def aggregate(scores: Sequence[float], how: str) -> float:
    """One number for a whole path from its step scores: mean (StepCo), min, prod or last."""
    if not scores:
        raise ValueError("cannot aggregate zero step scores")
    if how == "mean":
        return sum(scores) / len(scores)
    if how == "min":
        return min(scores)
    if how == "prod":
        product = 1.0
        for s in scores:
            product *= s
        return product
    if how == "last":
        return scores[-1]
    raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}; got {how!r}")
