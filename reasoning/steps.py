"""Step segmentation of model output.

The canonical format wraps every step in tags (StepCo style), the final answer sitting in the
last step::

    <Step> Tom has 3 + 4 = 7 apples.</Step>
    <Step> He gives away 2, so 7 - 2 = 5 are left. The answer is <ans>5</ans>.</Step>

`join_steps` writes that format, `split_steps` reads it back from any text and says how the
steps were found (`ReasoningPath.segmentation`):

- "tags": every `<Step>` closed;
- "unclosed_tags": the last `<Step>` has no `</Step>` (a truncated generation), its partial
  text is kept as the last step;
- "blank_lines" / "lines" / "whole": no tags, so paragraphs, else lines, else one chunk;
- "empty": nothing but whitespace, zero steps.

Text outside the tags (a preamble, a trailing "The answer is 5.") is not a step, but the answer
is extracted from the whole text, so a trailing untagged answer sentence still counts.
"""

from __future__ import annotations

import re

from reasoning.answers import extract_answer
from reasoning.grading import grade, is_correct
from reasoning.types import Problem, ReasoningPath

__all__ = ["ANSWER_MATCHES", "CLOSE_TAG", "OPEN_TAG", "answer_correct", "check_answer_match", "has_answer",
           "join_steps", "prefix_text", "split_steps"]

OPEN_TAG = "<Step>"
CLOSE_TAG = "</Step>"

_TAG_RE = re.compile(r"<Step>|</Step>")
_ANSWER_MARK_RE = re.compile(r"<ans>|answer is|\\boxed", re.IGNORECASE)
_BLANK_LINE_RE = re.compile(r"\n[ \t\r\f\v]*\n")


def join_steps(steps: list[str]) -> str:
    """Render steps as `<Step>s1</Step>\\n<Step>s2</Step>...`.

    Raises ValueError when a step contains a `<Step>` or `</Step>` tag (it could not be read back).
    """
    for i, step in enumerate(steps):
        if not isinstance(step, str):
            raise TypeError(f"step {i} is {type(step).__name__}, not str")
        if OPEN_TAG in step or CLOSE_TAG in step:
            raise ValueError(f"step {i} contains a {OPEN_TAG} or {CLOSE_TAG} tag: {step[:80]!r}")
    # A space after the opening tag: the step's first word then tokenizes as it does inside a
    # sentence (" Tom", not "Tom"), so a model copies names from the question as the same token.
    return "\n".join(f"{OPEN_TAG} {step.strip()}{CLOSE_TAG}" for step in steps)


def prefix_text(steps: list[str]) -> str:
    """The text of the given (kept) steps as a model continues it: `join_steps(steps)` plus "\\n".

    Empty for no steps, so a prompt plus `prefix_text(path.steps[:k])` is where generation resumes.
    """
    return join_steps(steps) + "\n" if steps else ""


def _split_tagged(text: str) -> tuple[list[str], bool]:
    """(step texts, last step unclosed) of a text with at least one tag.

    A `<Step>` while a step is open closes it first (the model forgot `</Step>`); a `</Step>`
    with no open step closes the text since the previous tag (a generation that starts inside a
    step, after a prompt ending in `<Step>`).
    """
    chunks: list[str] = []
    open_at: int | None = None  # start of the open step's text
    prev_end = 0  # end of the previous tag
    for m in _TAG_RE.finditer(text):
        if m.group(0) == OPEN_TAG:
            if open_at is not None:
                chunks.append(text[open_at : m.start()])
            open_at = m.end()
        else:
            start = open_at if open_at is not None else prev_end
            chunks.append(text[start : m.start()])
            open_at = None
        prev_end = m.end()
    unclosed = open_at is not None
    if unclosed:
        chunks.append(text[open_at:])
    return chunks, unclosed


def split_steps(text: str) -> ReasoningPath:
    """Split a model output into steps; see the module docstring for the formats. Never raises."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    answer = extract_answer(text)
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    stripped = normalized.strip()
    if not stripped:
        return ReasoningPath(steps=[], answer=answer, raw=text, segmentation="empty")
    if OPEN_TAG in text or CLOSE_TAG in text:
        chunks, unclosed = _split_tagged(text)
        segmentation = "unclosed_tags" if unclosed else "tags"
    elif _BLANK_LINE_RE.search(stripped):
        chunks, segmentation = _BLANK_LINE_RE.split(stripped), "blank_lines"
    elif "\n" in stripped:
        chunks, segmentation = stripped.split("\n"), "lines"
    else:
        chunks, segmentation = [stripped], "whole"
    steps = [chunk.strip() for chunk in chunks if chunk.strip()]
    return ReasoningPath(steps=steps, answer=answer, raw=text, segmentation=segmentation)


def has_answer(text: str) -> bool:
    """Whether a step or text states a final answer (`<ans>`, "answer is" or `\\boxed`), not just
    ends on a number."""
    return bool(_ANSWER_MARK_RE.search(text or ""))


ANSWER_MATCHES = ("strict", "flexible")
"""The answer checks, by name (after lm-eval-harness's strict-match and flexible-extract):

- "strict": only a stated answer counts (`has_answer`: `<ans>`, "answer is", `\\boxed`); a text
  that merely ends on the gold number is wrong. Training's default (PPO's gold reward, annotation's
  labels), since a trailing-number check pays a policy for ending on any number it can guess.
- "flexible": the evaluation's extraction (`reasoning.answers.extract_answer`), which falls back to
  the last number of the text when no answer is stated.
"""


def check_answer_match(mode: str, flag: str = "--answer_match") -> str:
    """`mode` when it names an answer check (ANSWER_MATCHES), else ValueError in one line naming `flag`."""
    if mode not in ANSWER_MATCHES:
        raise ValueError(f"{flag} must be one of {', '.join(ANSWER_MATCHES)}; got {mode!r}")
    return mode


def answer_correct(text: str, problem: Problem, match: str = "strict", prediction: str | None = None) -> bool:
    """Right by the gold answer under the answer check `match` (ANSWER_MATCHES; "strict" by default,
    counting only a stated answer, not a trailing number): a problem without a gold answer is wrong.

    `prediction`, when given, is the answer already taken from `text` (an inference method's vote or
    choice) and is graded in place of the text's own extraction; "strict" still asks `text` to state
    an answer. The one answer check of the toolkit: annotation's rollout labels, PPO's gold reward
    and the implicit PRM's labels (`--answer_match`), and the evaluation's two accuracies."""
    check_answer_match(match, "match")
    if not problem.answer or (match == "strict" and not has_answer(text)):
        return False
    if prediction is None:
        return grade(text, problem).correct
    return is_correct(prediction, problem.answer, problem.answer_kind, problem.options)
