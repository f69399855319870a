"""Brace matching, shared by answer extraction (`reasoning.answers`) and the LaTeX answer reader
(`reasoning.latex_answers`), so that neither imports the other to find a `{...}` span."""

from __future__ import annotations


def matching_braces(text: str) -> dict[int, int]:
    """Map the index of every balanced `{` to the index of its `}` (escaped `\\{`, `\\}` skipped).

    One pass with a stack, so finding every `\\boxed{...}` of a long text stays linear.
    """
    match: dict[int, int] = {}
    stack: list[int] = []
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
            continue
        if ch == "\\":
            escaped = True
        elif ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            match[stack.pop()] = i
    return match
