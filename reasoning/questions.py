"""Questions that no method can be asked: refused where a command reads its problems.

`check_questions(problems, source)` is run by evaluation, PPO and annotation on the problems they
read, before any model loads: an empty (or blank) question is a broken row, not a problem a model
failed, so it is named (the set, its position and id) instead of being answered silently.
"""

from __future__ import annotations

from collections.abc import Sequence

from reasoning.types import Problem


class QuestionError(ValueError):
    """A problem set with a question that cannot be asked, said in one line."""


def check_questions(problems: Sequence[Problem], source: str) -> None:
    """QuestionError naming the first problem of `source` (a flag and file, say) whose question is
    empty or only blanks, with how many such problems there are."""
    empty = [(i, p) for i, p in enumerate(problems, start=1)
             if not isinstance(p.question, str) or not p.question.strip()]
    if not empty:
        return
    i, first = empty[0]
    more = f" ({len(empty)} problems have none)" if len(empty) > 1 else ""
    raise QuestionError(f"{source}: problem {i} (id {first.id!r}) has an empty question{more}; "
                        "fill it in or remove the row")
