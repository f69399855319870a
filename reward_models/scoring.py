"""Scoring a batch of reasoning paths with a verifier, with one rule for the paths it cannot score.

PPO rewards, the inference methods, annotation (AutoPSV's ORM) and step-level evaluation all score
paths here, so a path is unscorable for the same reasons everywhere, and it is counted and returned
as None: it never fails the batch and is never dropped unsaid.

1. A path `validate_paths` refuses (zero steps, an empty step, a step tag inside a step) is not
   sent to the verifier.
2. The others go to `verifier.score` in batches of `batch_size` (all in one call by default).
3. A batch the verifier refuses with `VerifierInputError` (a path longer than its context, a
   question the exact checker does not know) is scored path by path; a path refused on its own is
   unscorable.

Any other error is the verifier's, not the path's, and is raised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from reward_models.verifier import VerifierInputError, validate_paths

__all__ = ["ScoredPaths", "score_paths", "unscorable_reason"]

StepScores = list[float]


@dataclass
class ScoredPaths:
    """The step scores of a batch of paths, and why the unscorable ones were refused."""

    scores: list[StepScores | None]
    """Per path, in order: one score per step, or None when the path could not be scored."""
    errors: dict[int, str] = field(default_factory=dict)
    """The index of each unscorable path and the message it was refused with."""

    @property
    def unscorable(self) -> int:
        """How many paths could not be scored (the number to report)."""
        return len(self.errors)

    def reasons(self) -> Counter:
        """The unscorable paths counted by short reason (`unscorable_reason`)."""
        return Counter(unscorable_reason(message) for message in self.errors.values())


_REASON_WORDS = (("no_steps", ("zero steps",)), ("empty_step", ("empty",)), ("too_long", ("longer than",)),
                 ("step_tag", ("step tag",)), ("unknown_question", ("not found",)))


def unscorable_reason(message: str) -> str:
    """A short key for why a path was refused: no_steps, empty_step, too_long, step_tag,
    unknown_question, else error."""
    text = message.lower()
    for key, words in _REASON_WORDS:
        if any(w in text for w in words):
            return key
    return "error"


def score_paths(
    verifier,
    questions: Sequence[str],
    paths: Sequence[Sequence[str]],
    *,
    batch_size: int | None = None,
    score_batch: Callable[[list[int]], Sequence[Sequence[float]]] | None = None,
    batches: Callable[[Iterable[int]], Iterable[int]] | None = None,
) -> ScoredPaths:
    """The verifier's step scores of every path, None for an unscorable one (see the module
    docstring for the rule).

    `score_batch(indices)`, when given, scores the paths at those indices in place of
    `verifier.score` (a caller that charges each call to the problems it serves); `batches` wraps
    the iterable of batch starts (a progress bar)."""
    if len(questions) != len(paths):
        raise ValueError(f"{len(questions)} questions but {len(paths)} paths")
    if score_batch is None:
        def score_batch(idx: list[int]) -> Sequence[Sequence[float]]:
            return verifier.score([questions[i] for i in idx], [list(paths[i]) for i in idx])

    result = ScoredPaths([None] * len(paths))
    sendable = []
    for i, (question, steps) in enumerate(zip(questions, paths)):
        try:
            validate_paths([question], [steps])
        except VerifierInputError as err:
            result.errors[i] = str(err)
            continue
        sendable.append(i)
    size = batch_size or max(len(sendable), 1)
    starts: Iterable[int] = range(0, len(sendable), size)
    if batches is not None:
        starts = batches(starts)
    for start in starts:
        chunk = sendable[start : start + size]
        try:
            got = score_batch(chunk)
        except VerifierInputError:
            for i in chunk:
                try:
                    result.scores[i] = list(score_batch([i])[0])
                except VerifierInputError as err:
                    result.errors[i] = str(err)
            continue
        if len(got) != len(chunk):
            raise ValueError(f"the verifier returned {len(got)} score lists for {len(chunk)} paths")
        for i, s in zip(chunk, got):
            result.scores[i] = list(s)
    return result
