"""LaTeX answers: the screen in front of sympy, and math-verify's extraction behind it.

`safe_for_sympy(s)` says whether math-verify (sympy) can be trusted to finish quickly on `s`:
power towers, huge exponents, factorials and binomials of big numbers, sums, products, integrals,
limits and very long strings are refused. Both the grader and the extraction below ask it first,
because math-verify runs here without its signal-based timeout (so that it works off the main
thread).

`math_verify_answer(text)` is the final answer of a model output as math-verify's own extraction
finds it: `\\boxed{}` (all boxes of a list such as `\\boxed{1}, \\boxed{2} and \\boxed{3}`), "final
answer is", "Answer:", LaTeX environments (`$..$`, `\\[..\\]`, `\\(..\\)`, over several lines for the
display ones), plain numbers (thousands separators, decimal commas) and expressions, tried in
its priority order and rightmost first. Its regular expressions and its LaTeX normalisation are
used; each candidate is screened by `safe_for_sympy` before it is parsed. Returned as the LaTeX
string math-verify parsed, so the grader compares it like any other answer.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any, NamedTuple

from reasoning.braces import matching_braces

__all__ = [
    "MATH_VERIFY_MAX_CHARS",
    "FoundAnswer",
    "UNANCHORED_PRIORITY",
    "math_verify_answer",
    "plain_letters",
    "safe_for_sympy",
]

logger = logging.getLogger(__name__)

# Inputs longer than this (after normalization) are not handed to math-verify.
MATH_VERIFY_MAX_CHARS = 300

# A power whose exponent holds another power, a factorial or a big number can take sympy
# forever (9^{9^{9^9}}, 10^{100000000}); so can factorials and binomials of big numbers.
_UNBOUNDED_COMMANDS_RE = re.compile(r"\\(?:sum|prod|int|iint|oint|lim)(?![A-Za-z])")


def _exponent_spans(s: str) -> list[str]:
    """The text of every exponent in `s`; a power right after it (2^3^4) adds a "^" to its span."""
    spans = []
    braces: dict[int, int] | None = None
    for m in re.finditer(r"\^", s):
        i = m.end()
        while i < len(s) and s[i] == " ":
            i += 1
        if i >= len(s):
            continue
        if s[i] == "{":
            if braces is None:
                braces = matching_braces(s)
            close = braces.get(i)
            end = close + 1 if close is not None else len(s)
            span = s[i + 1 : end - 1] if close is not None else s[i + 1 :]
        elif s[i] == "(":
            depth, j = 0, i
            while j < len(s):
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                if depth == 0:
                    break
                j += 1
            end = min(j + 1, len(s))
            span = s[i + 1 : j]
        else:
            token = re.match(r"\\?[A-Za-z]+|[\d.]+|.", s[i:], re.DOTALL)
            span = token.group(0) if token else ""
            end = i + len(span)
        if s[end:].lstrip().startswith("^"):
            span += "^"
        spans.append(span)
    return spans


def safe_for_sympy(s: str) -> bool:
    """Whether math-verify (sympy) can be trusted to finish quickly on `s`."""
    s = s.replace("**", "^")  # a plain expression's power
    if len(s) > MATH_VERIFY_MAX_CHARS or _UNBOUNDED_COMMANDS_RE.search(s):
        return False
    for span in _exponent_spans(s):
        if "^" in span or "!" in span or "\\binom" in span or "\\choose" in span:
            return False
        if any(len(d) > 4 for d in re.findall(r"\d+", span)):
            return False
    for m in re.finditer(r"!", s):
        before = s[: m.start()].rstrip()
        digits = re.search(r"(\d+)$", before)
        if digits:
            if len(digits.group(1)) > 4:
                return False
        elif before.endswith((")", "}", "]")):
            return False
    big_binomial = re.search(r"\\[dt]?binom|\\choose", s) and re.search(r"\d{5,}", s)
    return not big_binomial


# `\mathrm{e}`, `\mathrm{i}`: an upright constant. math-verify cuts `\frac{1}{\mathrm{e}}` short (it
# reads 1 - 1/e as 1), so the letter is unwrapped before it sees the text.
_UPRIGHT_LETTER_RE = re.compile(r"\\(?:mathrm|mathit|rm)\s*\{\s*([A-Za-z])\s*\}")


def plain_letters(s: str) -> str:
    """`\\mathrm{e}` -> `e`: single upright letters unwrapped, everything else left as it is."""
    return _UPRIGHT_LETTER_RE.sub(r"\1", s) if "\\m" in s or "\\r" in s else s


# ----------------------------------------------------------------------------------------------
# math-verify's extraction

# Only the end of a very long output is searched (some of the regular expressions are quadratic),
# and only the last few candidates of each pattern are parsed.
_MAX_TEXT_CHARS = 4000
_MAX_CANDIDATES_PER_PATTERN = 20
# Candidates of this priority or above are found without an anchor ("answer", "final answer is",
# a box): any LaTeX or number in the text.
UNANCHORED_PRIORITY = 300

_BOXED_OPEN_RE = re.compile(r"\\boxed\s*\{")


@lru_cache(maxsize=1)
def _patterns() -> tuple[tuple[int, Any, Any], ...]:
    """(priority, compiled regex, target) of math-verify's LaTeX and expression extraction.

    Boxed answers have the top priority, level with "final answer is X. I hope", as in
    math-verify's own tests; within a priority the rightmost match wins.
    """
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, get_extraction_regexes

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    found = [
        (priority, regex, target)
        for regexes, target in get_extraction_regexes(targets)
        for regex, priority in regexes
    ]
    return tuple(sorted(found, key=lambda item: item[0]))


def _payloads(match: re.Match[str]) -> list[str]:
    """The strings of a match that math-verify would hand to sympy."""
    payloads: list[str] = []
    for name, value in match.groupdict().items():
        if not value:
            continue
        if name.endswith("latexBoxed"):
            braces = matching_braces(value)
            boxes = [(b.end() - 1, braces.get(b.end() - 1)) for b in _BOXED_OPEN_RE.finditer(value)]
            payloads.extend(value[o + 1 : c] if c is not None else value[o + 1 :] for o, c in boxes)
        elif "latex" in name or name == "expr":
            payloads.append(value)
    return payloads


# Inline math must stay on one line: math-verify's LaTeX patterns refuse `$ <newline> 9 <newline> $`;
# its plain-number patterns would still read the 9, so numbers inside such a span are skipped.
_BROKEN_INLINE_RE = re.compile(r"(?<![\\$])\$[ \t]*\n[^$]*\n[ \t]*\$(?!\$)|\\\([ \t]*\n.*?\n[ \t]*\\\)", re.DOTALL)


def _candidates(text: str) -> list[tuple[int, re.Match[str], Any, bool]]:
    """(priority, match, target, safe) best first: by priority, then rightmost end, leftmost start.

    A match whose math sympy could hang on stays in its place, marked unsafe: it is the answer
    there, unparsed, rather than letting a number inside it ("9" of `9^{9^{9^9}}`) win instead.
    """
    from math_verify.parser import ExprExtractionConfig

    broken = [m.span() for m in _BROKEN_INLINE_RE.finditer(text)] if "\n" in text else []

    def in_broken_inline(m: re.Match[str], target: Any) -> bool:
        if not broken or not isinstance(target, ExprExtractionConfig):
            return False
        starts = [m.start(k) for k, v in m.groupdict().items() if v and k.startswith(("expr", "integer", "decimal"))]
        return any(a <= i < b for i in starts for a, b in broken)

    found: list[tuple[int, re.Match[str], Any, bool]] = []
    for priority, regex, target in _patterns():
        matches = [m for m in regex.finditer(text) if not in_broken_inline(m, target)]
        found.extend(
            (priority, m, target, all(safe_for_sympy(p) for p in _payloads(m)))
            for m in matches[-_MAX_CANDIDATES_PER_PATTERN:]
        )
    found.sort(key=lambda item: (item[0], -item[1].end(), item[1].start()))
    return found


class FoundAnswer(NamedTuple):
    """An answer math-verify's extraction found in a text."""

    answer: str
    """The LaTeX string math-verify parsed (the parts of a list joined by ", ")."""
    priority: int
    """How it was found: below UNANCHORED_PRIORITY after an anchor (a box, "final answer is")."""
    matched: str
    """The text the extraction pattern matched."""


def math_verify_answer(text: str) -> FoundAnswer | None:
    """The first candidate of `text` that math-verify parses, or None.

    A candidate sympy could hang on is returned as its raw text, unparsed (the grader refuses it).
    None when math-verify is not installed or nothing parses. Never raises.
    """
    try:
        from math_verify.parser import extract_match
    except ImportError:  # pragma: no cover - math-verify is a dependency
        return None
    try:
        text = plain_letters(text[-_MAX_TEXT_CHARS:])
        for priority, match, target, safe in _candidates(text):
            if not safe:
                return FoundAnswer(", ".join(p.strip() for p in _payloads(match)), priority, match.group(0))
            try:
                value, answer = extract_match(match, target)
            except Exception:  # noqa: BLE001 - sympy may raise anything on model text
                continue
            if value is not None and answer and answer.strip():
                answer = answer.replace(" and ", ", ").strip()
                if answer == "\\frac{1}{2}" and "frac" not in match.group(0):
                    answer = "0.5"  # math-verify's normaliser rewrites a bare 0.5; keep what was written
                return FoundAnswer(answer, priority, match.group(0))
    except Exception:  # noqa: BLE001 - extraction must never raise on model text
        logger.debug("math-verify extraction failed on %r", text[:200], exc_info=True)
    return None
