"""Final-answer extraction from model output.

`extract_answer` finds the final answer of a solution text, trying the explicit forms first:

1. the last `<ans>...</ans>` (or an unclosed `<ans>X` left by a truncated generation),
2. the last `\\boxed{...}` / `\\fbox{...}` (braces matched by counting, so nested braces work),
3. the last "The answer is X" / "The final answer is X" / "Answer: X" / "#### X" sentence,
4. for `kind="number"`: the last number in the text; for `kind="choice"`: the last option letter;
   for `kind="text"`: the whole text when it is one short line (a bare answer).

`kind="latex"` (MATH-style answers) takes `<ans>` first and then math-verify's own extraction
(`reasoning.latex_answers.math_verify_answer`: all boxes of a list, "final answer is", LaTeX
environments, decimal commas), screened so that sympy never sees an input it could hang on;
steps 2-3 and a bare line remain the fallback.

`extract_number` turns an answer string into a number ("1,080", "$5.50", "50%", "3/4", "12 apples").

Model text is data: everything here is string and regex work plus `fractions.Fraction`; nothing
is evaluated (the LaTeX path hands screened candidates to math-verify's parser, never to `eval`).
No function in this module raises on any input string.
"""

from __future__ import annotations

import re
from fractions import Fraction

from reasoning.braces import matching_braces

__all__ = [
    "choice_letter",
    "extract_answer",
    "extract_number",
    "find_boxed",
    "matching_braces",
    "parse_number",
    "unwrap_text_commands",
]

CHOICE_LETTERS = "ABCDE"

# A bare-answer fallback (kinds latex/text) only takes a single line of at most this many characters.
_BARE_ANSWER_MAX_CHARS = 120

_ANS_TAG_RE = re.compile(r"<(/?)ans>", re.IGNORECASE)
# An unclosed <ans> runs until the end of its step, a blank line or the end of the text.
_UNCLOSED_END_RE = re.compile(r"</?Step>|</?ans>|\n\s*\n", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE_RE = re.compile(r"\\boxed[ \t]+([^\s${}]+)")
_PHRASE_RE = re.compile(
    r"(?:\banswers?\s*(?:\bis\b|:|=)|####)[ \t]*(?:[:*][ \t]*)*",
    re.IGNORECASE,
)
_PHRASE_MAX_CHARS = 500
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)|</?Step>|</?ans>", re.IGNORECASE)

# One number: optional sign, integer part with or without thousands commas, optional decimals,
# optional "/denominator"; or a bare decimal like ".5". Not preceded by a letter, digit or dot,
# so "x2", "v3.1" and the "5" of "3-5" (a range) are not read as numbers on their own.
_NUMBER_PATTERN = (
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
    r"|(?<![\w.])[-+]?\.\d+"
)
_NUMBER_RE = re.compile(_NUMBER_PATTERN)
# A mixed number: a whole part, spaces and a proper fraction ("7 3/4" is 31/4), with no digit,
# point, comma or slash on either side (so "1, 3/4", "2 3/4/5" and "7 3/2" are not read as one).
_MIXED_NUMBER_RE = re.compile(r"(?<![\w.,/])([-+]?)(\d+)[ \t]+(\d+)[ \t]*/[ \t]*(\d+)(?![\w.,/])")
# What may surround the single number of an answer: words, currency, percent, light punctuation.
_NUMBER_LEFTOVER_RE = re.compile(r"[\sA-Za-z$%.,:;!?'\"°€£¥*()]*")
_ASSIGNMENT_PREFIX_RE = re.compile(r"^\s*[A-Za-z][A-Za-z_ ]{0,30}?\s*=\s*")

# A word of prose: two letters or more, not a LaTeX command.
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")

_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{")

_CHOICE_PATTERNS = (
    re.compile(r"^\(?([A-Ea-e])\)?\.?$"),
    re.compile(r"^\(([A-Ea-e])\)"),
    re.compile(r"^([A-Ea-e])\)"),
    re.compile(r"^([A-E])\s*[.:](?:\s|$)"),
    re.compile(r"^(?:option|choice)\s*:?\s*\(?([A-Ea-e])\)?(?![A-Za-z])", re.IGNORECASE),
)
_CHOICE_PAREN_RE = re.compile(r"\(([A-E])\)")
_CHOICE_STANDALONE_RE = re.compile(r"(?<![A-Za-z0-9_\\])([A-E])(?![A-Za-z0-9_'])")


def find_boxed(text: str) -> str | None:
    """Content of the last balanced `\\boxed{...}` / `\\fbox{...}` (or `\\boxed X`), else None."""
    if not isinstance(text, str) or "\\" not in text:
        return None
    best: tuple[int, str] | None = None
    braced = list(_BOXED_RE.finditer(text))
    if braced:
        match = matching_braces(text)
        for m in reversed(braced):
            open_idx = m.end() - 1
            close_idx = match.get(open_idx)
            if close_idx is not None:
                best = (m.start(), text[open_idx + 1 : close_idx])
                break
    for m in _BOXED_BARE_RE.finditer(text):
        if best is None or m.start() > best[0]:
            best = (m.start(), m.group(1))
    return best[1] if best is not None else None


def unwrap_text_commands(s: str) -> str:
    """Replace `\\text{X}` (and `\\mbox`, `\\mathrm`, ...) by X, braces matched."""
    for _ in range(20):  # nested wrappers; bounded so a pathological input cannot loop long
        m = _TEXT_WRAPPER_RE.search(s)
        if m is None:
            break
        open_idx = m.end() - 1
        close_idx = matching_braces(s).get(open_idx)
        if close_idx is None:
            s = s[: m.start()] + s[m.end() :]
        else:
            s = s[: m.start()] + s[open_idx + 1 : close_idx] + s[close_idx + 1 :]
    return s


# ----------------------------------------------------------------------------------------------
# cleaning a candidate answer


def _clean_candidate(s: str) -> str:
    """Strip the decoration around an answer: spaces, `$`, `\\(..\\)`, `**`, a trailing period."""
    s = s.strip()
    boxed = find_boxed(s)
    if boxed is not None and s.startswith(("\\boxed", "\\fbox", "$\\boxed", "\\(\\boxed")):
        s = boxed.strip()
    for _ in range(3):
        before = s
        s = s.strip().strip("*").strip()
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2].strip()
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2].strip()
        s = s.rstrip(".").strip()
        if s.startswith("$") and s.endswith("$") and not s.endswith("\\$"):
            s = s.strip("$").strip()
        if s.endswith("$") and s.count("$") == 1 and not s.endswith("\\$"):
            s = s[:-1].strip()
        if s.startswith("$") and s.count("$") == 1 and not any(c.isdigit() for c in s[1:2]):
            s = s[1:].strip()
        if s == before:
            break
    return s


def _ans_tag_candidate(text: str) -> tuple[int, str] | None:
    """(position, content) of the last <ans> answer, closed or unclosed; None if there is none.

    One pass over the tags (not a lazy regex per tag), so a text full of unclosed `<ans>` stays
    linear. An `<ans>` inside an open one restarts it.
    """
    if "<" not in text:
        return None
    closed: list[tuple[int, str]] = []
    open_tag: re.Match[str] | None = None
    for tag in _ANS_TAG_RE.finditer(text):
        if not tag.group(1):
            open_tag = tag
        elif open_tag is not None:
            closed.append((open_tag.start(), text[open_tag.end() : tag.start()]))
            open_tag = None
    if open_tag is not None:
        rest = text[open_tag.end() :]
        end = _UNCLOSED_END_RE.search(rest)
        content = _clean_candidate(rest[: end.start()] if end else rest)
        if content:
            return open_tag.start(), content
    for start, raw in reversed(closed):
        content = _clean_candidate(raw)
        if content:
            return start, content
    return None


def _phrase_candidates(text: str) -> list[str]:
    """Answers of "The answer is X" / "Answer: X" / "#### X" sentences, last first."""
    lowered_has = "answer" in text.lower() or "####" in text
    if not lowered_has:
        return []
    found: list[str] = []
    for m in _PHRASE_RE.finditer(text):
        # the answer runs to the end of its line; an answer sentence is never this long
        limit = min(len(text), m.end() + _PHRASE_MAX_CHARS)
        line_end = text.find("\n", m.end(), limit)
        rest = text[m.end() : line_end if line_end != -1 else limit]
        boxed = find_boxed(rest)
        if boxed is not None:
            content = _clean_candidate(boxed)
        else:
            end = _SENTENCE_END_RE.search(rest)
            content = _clean_candidate(rest[: end.start()] if end else rest)
        if content:
            found.append(content)
    found.reverse()
    return found


def choice_letter(s: str | None) -> str | None:
    """The option letter A-E that `s` names ("C", "(c)", "C) 21", "\\text{(C)}", "Option C")."""
    if not isinstance(s, str):
        return None
    s = _clean_candidate(unwrap_text_commands(s))
    s = s.strip().strip("*").strip()
    for pattern in _CHOICE_PATTERNS:
        m = pattern.match(s)
        if m:
            return m.group(1).upper()
    return None


def _has_digit(s: str) -> bool:
    return any(c.isdigit() for c in s)


def _last_number(text: str) -> str | None:
    matches = list(_NUMBER_RE.finditer(text))
    last = matches[-1] if matches else None
    if last is None:
        return None
    return re.sub(r"\s+", "", last.group(0)).replace(",", "")


def _last_choice_letter(text: str) -> str | None:
    parens = list(_CHOICE_PAREN_RE.finditer(text))
    paren = parens[-1] if parens else None
    if paren is not None:
        return paren.group(1)
    for m in reversed(list(_CHOICE_STANDALONE_RE.finditer(text))):
        letter = m.group(1)
        # "A" followed by a lower-case word is the article, not option A.
        if letter == "A" and re.match(r"\s+[a-z]", text[m.end() : m.end() + 2]):
            continue
        return letter
    return None


def extract_answer(text: str, kind: str = "number") -> str | None:
    """The final answer of a model output `text`, or None when none can be found.

    kind: "number" (falls back to the last number), "choice" (returns an option letter A-E when
    one is named, else the explicit answer text or the last number, so the grader can match it to
    an option's value), "latex",
    "text" or "none" (fall back to the whole text when it is a single short line).
    Never raises.
    """
    try:
        return _extract_answer(text, kind)
    except Exception:  # noqa: BLE001 - extraction must never raise on model text
        return None


def _extract_answer(text: str, kind: str) -> str | None:
    if not isinstance(text, str) or not text.strip():
        return None
    candidates: list[str] = []
    tagged = _ans_tag_candidate(text)
    if tagged is not None:
        candidates.append(tagged[1])
    boxed = find_boxed(text)
    if boxed is not None:
        cleaned = _clean_candidate(boxed)
        if cleaned:
            candidates.append(cleaned)
    candidates.extend(_phrase_candidates(text))

    if kind == "choice":
        for cand in candidates:
            letter = choice_letter(cand)
            if letter is not None:
                return letter
        if candidates:
            return candidates[0]
        # no letter anywhere: the last number, which the grader matches to the one option it is
        return _last_choice_letter(text) or _last_number(text)

    if kind == "number":
        for cand in candidates:
            if _has_digit(cand):
                return cand
        return _last_number(text)

    if kind == "latex":
        return _latex_answer(text, tagged is not None, candidates)

    if candidates:
        return candidates[0]
    return _bare_answer(text)


def _latex_answer(text: str, tagged: bool, candidates: list[str]) -> str | None:
    """A LaTeX answer: `<ans>` first, then math-verify's extraction, then the bare text.

    math-verify finds boxes (all of a list of boxes), "final answer is", "Answer:" and LaTeX
    environments; an answer it finds without any such anchor (any LaTeX or number in the text)
    ranks below this module's "The answer is X" sentences.
    """
    if tagged:
        return candidates[0]
    from reasoning.latex_answers import UNANCHORED_PRIORITY, math_verify_answer

    found = math_verify_answer(text)
    if found is not None and found.priority < UNANCHORED_PRIORITY:
        return found.answer
    if candidates:
        return candidates[0]
    bare = _bare_answer(text)
    if found is None:
        return bare
    # A bare formula without words ("2x+3", "x = 5") is the answer as a whole, not the number
    # math-verify finds inside it; a line of prose is searched ("so we need $x \\geq 5$").
    if bare is not None and not _WORD_RE.search(bare) and _squash(found.matched) != _squash(bare):
        return bare
    return found.answer


def _squash(s: str) -> str:
    return re.sub(r"[\s$]", "", s)


def _bare_answer(text: str) -> str | None:
    """The whole text when it is a single short line (a bare answer), cleaned; else None."""
    stripped = text.strip()
    if "\n" not in stripped and len(stripped) <= _BARE_ANSWER_MAX_CHARS:
        cleaned = _clean_candidate(stripped)
        return cleaned or None
    return None


# ----------------------------------------------------------------------------------------------
# numbers


# \frac{a}{b}, \dfrac12, \frac{a}b with plain-number parts, optionally after a whole part (1\frac{4}{5})
_LATEX_FRAC_RE = re.compile(
    r"(?:(?<![\w.,])(\d+)\s*)?"
    r"\\[dt]?frac\s*(?:\{\s*([-+]?[\d.,]+)\s*\}|(\d))\s*(?:\{\s*([-+]?[\d.,]+)\s*\}|(\d))"
)
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")


def _latex_to_plain(s: str) -> str:
    """Rewrite the LaTeX that decorates plain numbers: \\$, \\%, \\!, {,}, \\frac{a}{b}, \\text{}."""
    if "\\" not in s and "{" not in s and "°" not in s:
        return s
    s = unwrap_text_commands(s)
    s = s.replace("\\$", "$").replace("\\%", "%").replace("{,}", ",")
    s = re.sub(r"\\[!,;: ]", "", s)
    s = _DEGREE_RE.sub("", s)
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)

    def frac(m: re.Match[str]) -> str:
        whole = m.group(1)
        num = m.group(2) if m.group(2) is not None else m.group(3)
        den = m.group(4) if m.group(4) is not None else m.group(5)
        if whole is not None:
            if num.isdigit() and den.isdigit() and int(den) != 0:
                # a mixed number: 1\frac{4}{5} is 9/5
                return f"{int(whole) * int(den) + int(num)}/{den}"
            return f"{whole} {num}/{den}"
        return f"{num}/{den}"

    return _LATEX_FRAC_RE.sub(frac, s)


def _fraction_of(token: str) -> Fraction | None:
    token = re.sub(r"\s+", "", token).replace(",", "")
    sign = 1
    if token.startswith(("-", "+")):
        sign = -1 if token[0] == "-" else 1
        token = token[1:]
    if "/" in token:
        num_s, den_s = token.split("/", 1)
        num, den = Fraction(num_s), Fraction(den_s)
        if den == 0:
            return None
        return sign * num / den
    return sign * Fraction(token)


def improper_fraction(text: str) -> str:
    """`text` with its mixed number, when it has exactly one, written as one fraction: "7 3/4 cups"
    -> "31/4 cups". A whole part and a proper fraction (numerator below the denominator) side by
    side, nothing else: "7 3/2" or "2 3/4 5" stay as they are (two numbers, read as such)."""
    found = list(_MIXED_NUMBER_RE.finditer(text))
    if len(found) != 1:
        return text
    m = found[0]
    sign, whole, num, den = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if not 0 < num < den:
        return text
    return f"{text[: m.start()]}{sign}{whole * den + num}/{den}{text[m.end() :]}"


def parse_number(s: str | None) -> tuple[Fraction, bool] | None:
    """(value, is_percent) of the single number in `s`, or None.

    Accepts thousands commas, a currency sign, a percent sign, a fraction "3/4", a mixed number
    "7 3/4" (31/4), simple LaTeX
    (`\\frac{3}{4}`, `\\$5`, `10\\%`), a leading "x =" and words around the number ("12 apples").
    Returns None when there is no number, more than one, or math around it ("x^2", "5 + 3").
    """
    if not isinstance(s, str):
        return None
    try:
        text = _latex_to_plain(s).replace("\u2212", "-").strip()
        if text.count("=") == 1:
            text = _ASSIGNMENT_PREFIX_RE.sub("", text, count=1)
        text = improper_fraction(text)
        matches = list(_NUMBER_RE.finditer(text))
        if len(matches) != 1:
            return None
        m = matches[0]
        leftover = text[: m.start()] + " " + text[m.end() :]
        # a hyphen joining words ("12-year-old") is fine; one before a space or digit is math
        leftover = re.sub(r"-(?=[A-Za-z])", "", leftover)
        if not _NUMBER_LEFTOVER_RE.fullmatch(leftover):
            return None
        value = _fraction_of(m.group(0))
        if value is None:
            return None
        return value, "%" in leftover
    except (ValueError, ZeroDivisionError, OverflowError, ArithmeticError):
        return None


def extract_number(s: str) -> float | None:
    """The single number in an answer string as a float, or None.

    "1,080" -> 1080.0, "$5.50" -> 5.5, "50%" -> 50.0 (percent is handled by the grader),
    "3/4" -> 0.75, "-2" -> -2.0, "12 apples" -> 12.0; "3 and 4", "x^2", "" -> None.
    """
    parsed = parse_number(s)
    if parsed is None:
        return None
    try:
        return float(parsed[0])
    except (OverflowError, ValueError):
        return None
