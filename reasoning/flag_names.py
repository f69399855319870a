""""Did you mean": the known name closest to a misspelt one, for the command lines' one-line errors.

    unknown flag --rewrad; did you mean --reward?

One helper for every parser (PPO's, SFT's, the evaluation harness's), so a typo gets the same
answer everywhere: `difflib`'s closest match with a cutoff of 0.6, or nothing when no name is close.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]

CUTOFF = 0.6
"""How alike two names must be (`difflib.SequenceMatcher.ratio`) for the known one to be suggested."""


def closest(name: str, names: Iterable[str]) -> str | None:
    """The name of `names` closest to `name`, or None when none is close enough."""
    import difflib

    match = difflib.get_close_matches(name, sorted(set(names)), n=1, cutoff=CUTOFF)
    return match[0] if match else None


def did_you_mean(name: str, names: Iterable[str], prefix: str = "--") -> str:
    """"; did you mean --X?" with the closest of `names` to `name` (without its dashes), else ""."""
    match = closest(name.lstrip("-"), names)
    return f"; did you mean {prefix}{match}?" if match else ""
