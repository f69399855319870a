"""Grading a predicted final answer against the gold answer.

`is_correct(pred, gold, kind, options)` compares an extracted answer with the gold answer;
`grade(output_text, problem)` extracts the answer from a whole model output first.

Kinds (see `reasoning.types.ANSWER_KINDS`):

- number: numeric equality with relative tolerance 1e-6 (absolute 1e-9). Thousands commas, `$`,
  unit words, fractions ("3/4" == "0.75") and percentages (gold 50 or 0.5 == "50%") are handled.
- latex (MATH500): normalized string equality, then exact numeric equality of plain numbers, then
  math-verify (symbolic; an interval gold also matches the same set written as an inequality).
  "32, 349" is a list, never the number 32349; a decimal comma ("1,22", "0,111") equals the
  same digits with a point; `\\mathrm{e}` is e. math-verify runs without its signal-based
  timeout, so grading works in any thread; inputs that could make sympy run for ever (power
  towers, huge exponents, factorials and binomials of big numbers, sums/products/integrals/
  limits, very long strings) are refused instead (`reasoning.latex_answers.safe_for_sympy`), and
  such a prediction grades as incorrect.
- choice (AQuA): option letters; a prediction that is an option's text or value maps to its letter.
- text (ASDiv non-numeric answers): normalized case/space/punctuation equality, numeric equality
  when both sides are numbers, element-wise for multi-value answers like "32; 20".
- none (ProcessBench has no gold answer): always False.

Nothing here raises on any pred/gold string: an answer that cannot be read grades as incorrect.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from fractions import Fraction

from reasoning.answers import (
    choice_letter,
    extract_answer,
    improper_fraction,
    parse_number,
    unwrap_text_commands,
)
from reasoning.latex_answers import plain_letters, safe_for_sympy
from reasoning.types import ANSWER_KINDS, Problem

__all__ = ["GradeResult", "grade", "is_correct", "normalize_latex", "normalize_text", "numbers_close"]

logger = logging.getLogger(__name__)

REL_TOL = Fraction(1, 10**6)
ABS_TOL = Fraction(1, 10**9)


@dataclass
class GradeResult:
    """The grade of one model output."""

    correct: bool
    """Whether the extracted answer equals the gold answer."""
    extracted: str | None
    """The final answer found in the output, or None."""
    parsed: bool
    """False when no answer could be extracted from the output."""


# ----------------------------------------------------------------------------------------------
# numbers


def numbers_close(a: Fraction, b: Fraction) -> bool:
    """|a - b| <= max(1e-9, 1e-6 * max(|a|, |b|)), computed exactly."""
    if a == b:
        return True
    return abs(a - b) <= max(ABS_TOL, REL_TOL * max(abs(a), abs(b)))


def _candidates(parsed: tuple[Fraction, bool]) -> list[Fraction]:
    value, percent = parsed
    return [value, value / 100] if percent else [value]


def _numbers_equal(p: tuple[Fraction, bool], g: tuple[Fraction, bool]) -> bool:
    """Equal as numbers, reading a percentage either as itself or as a fraction (50% ~ 50 ~ 0.5)."""
    return any(numbers_close(a, b) for a in _candidates(p) for b in _candidates(g))


# ----------------------------------------------------------------------------------------------
# text


def normalize_text(s: str) -> str:
    """Lower case, no LaTeX text wrappers, no punctuation except inside numbers, single spaces.

    Signs and relations (+ - * = < > ^) stay, as separate tokens.
    """
    s = unwrap_text_commands(s).replace("$", " ").lower()
    s = re.sub(r"(?<=[a-z])\.(?=[a-z])", "", s)  # p.m. -> pm
    s = re.sub(r"(?<=\d)\s*:\s*(?=\d)", ":", s)  # 3 : 4 -> 3:4
    # . , : / stay only between digits (3.5, 1,000, 3:30, 3/7); elsewhere they are punctuation
    s = re.sub(r"(?<!\d)[.,:/]|[.,:/](?!\d)", " ", s)
    s = re.sub(r"(?<=\w)-(?=[a-z])", " ", s)  # a hyphen joining words: 12-year-old
    # signs and relations are part of the answer (1 + 1/e is not 1 - 1/e): kept, as tokens
    s = re.sub(r"\s*([-+*=<>^])\s*", r" \1 ", s)
    s = re.sub(r"[^\w\s.,:/%+*=<>^-]", " ", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"^(?:the|a|an) ", "", s)
    return s


def _single_value_equal(pred: str, gold: str) -> bool:
    g = parse_number(gold)
    if g is not None:
        p = parse_number(pred)
        if p is not None:
            return _numbers_equal(p, g)
    norm_g = normalize_text(gold)
    return bool(norm_g) and normalize_text(pred) == norm_g


_MULTI_SPLIT_RE = re.compile(r"\s*(?:;|,(?!\d{3}(?!\d))|\band\b)\s*", re.IGNORECASE)


def _is_correct_text(pred: str, gold: str) -> bool:
    if ";" in gold:
        gold_parts = [p.strip() for p in gold.split(";") if p.strip()]
        pred_parts = [p.strip() for p in _MULTI_SPLIT_RE.split(pred) if p and p.strip()]
        if len(gold_parts) > 1:
            return len(pred_parts) == len(gold_parts) and all(
                _single_value_equal(p, g) for p, g in zip(pred_parts, gold_parts)
            )
    return _single_value_equal(pred, gold)


def _is_correct_number(pred: str, gold: str) -> bool:
    g = parse_number(gold)
    if g is None:
        # a gold answer that is not one number (e.g. "3:4" in a number file): compare as text
        return _single_value_equal(pred, gold)
    p = parse_number(pred)
    return p is not None and _numbers_equal(p, g)


# ----------------------------------------------------------------------------------------------
# multiple choice


_OPTION_RE = re.compile(r"^\s*\(?([A-Ea-e])\s*[).:]\s*(.*)$", re.DOTALL)


def _parse_options(options: list[str]) -> list[tuple[str, str]]:
    parsed = []
    for i, opt in enumerate(options):
        if not isinstance(opt, str):
            continue
        m = _OPTION_RE.match(opt)
        if m:
            parsed.append((m.group(1).upper(), m.group(2).strip()))
        elif i < 26:
            parsed.append((chr(ord("A") + i), opt.strip()))
    return parsed


def _option_for(pred: str, options: list[str]) -> str | None:
    """The letter of the option whose text (or value) the prediction gives, if exactly one fits;
    None for a bare value that two options have ("7" for "A) 7" and "B) 7.0")."""
    parsed = _parse_options(options)
    norm_pred = normalize_text(pred)
    text_hits = [letter for letter, text in parsed if norm_pred and normalize_text(text) == norm_pred]
    p = parse_number(pred)
    value_hits = [] if p is None else [
        letter for letter, text in parsed if (o := parse_number(text)) is not None and _numbers_equal(p, o)]
    if len(value_hits) > 1 and not re.search(r"[A-Za-z]", pred):
        return None
    hits = text_hits or value_hits
    return hits[0] if len(hits) == 1 else None


def _is_correct_choice(pred: str, gold: str, options: list[str] | None) -> bool:
    g = choice_letter(gold)
    if g is None:
        return False
    p = choice_letter(pred)
    if p is None and options:
        p = _option_for(pred, options)
    return p == g


# ----------------------------------------------------------------------------------------------
# LaTeX


_SPACING_RE = re.compile(r"\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_SIZING_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?![A-Za-z])")
_DEGREES_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree(?![A-Za-z])")
_UNIT_TEXT_RE = re.compile(
    r"\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?"
)
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+")
_LATEX_FRAC_NUM_RE = re.compile(r"([-+]?)\\frac\{([-+]?[\d.]+)\}\{([-+]?[\d.]+)\}")
_MIXED_NUM_RE = re.compile(r"([-+]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac{a}b -> \\frac{a}{b}, \\sqrt2 -> \\sqrt{2} (spaces already gone)."""
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac(\{[^{}]*\})(\d)", r"\\frac\1{\2}", s)
    s = re.sub(r"\\frac\{([^{}]*)\}([A-Za-z])(?![A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    return s


_LIST_COMMA_RE = re.compile(r"(?<=\d),\s+(?=[-+]?\d{3}(?!\d))")
# A decimal comma ("1,22", "0,111"); "1,5" or "-2,1" are more often lists of two numbers.
_DECIMAL_COMMA_RE = re.compile(r"[-+]?(?:0,\d+|[1-9]\d*,\d\d)")


def normalize_latex(s: str) -> str:
    """A canonical spelling of a LaTeX answer for string comparison.

    Drops `$`, `\\$`, `\\left`/`\\right`, spacing, `\\text{}` wrappers, degrees, `\\%`, a trailing
    period and all whitespace; `\\dfrac`/`\\tfrac` become `\\frac`,
    `\\frac12` becomes `\\frac{1}{2}`; an option letter "(C)" becomes "C".
    """
    s = s.strip()
    # "32, 349" is a list, "32,349" a number: a comma followed by a space and three digits is a
    # list separator, kept apart from a thousands comma once the spaces are gone
    s = _LIST_COMMA_RE.sub(";", s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = _SIZING_RE.sub("", s)
    s = _SPACING_RE.sub("", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("\\displaystyle", "")
    s = unwrap_text_commands(s)
    s = _DEGREES_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    s = _fix_fracs(s)
    s = s.replace("{,}", ",")
    letter = re.fullmatch(r"\(([A-Za-z])\)", s)
    return letter.group(1) if letter else s


_ASSIGNMENT_RE = re.compile(r"([A-Za-z])(?:=|\\in(?![A-Za-z]))(.*)", re.DOTALL)


def _split_assignment(norm: str) -> tuple[str | None, str]:
    """("x", "5") for a normalized "x=5" or "x\\in[1,2]"; (None, norm) otherwise."""
    m = _ASSIGNMENT_RE.fullmatch(norm)
    if m is None or "=" in m.group(2):
        return None, norm
    return m.group(1), m.group(2)


def _latex_number(s: str) -> tuple[Fraction, bool] | None:
    """(value, is_percent) when the LaTeX answer is a plain number, else None.

    Plain numbers: "18.90", "10,080", "\\frac{3}{4}", "3/4", "1\\frac{4}{5}", with optional `\\$`,
    `\\%`, degrees, spacing and a unit in `\\text{}` ("5.4 \\text{ cents}"); "x = 5" too.
    """
    percent = "%" in s
    s = _UNIT_TEXT_RE.sub("", s)
    s = _split_assignment(normalize_latex(s))[1]
    s = re.sub(r"(?<=\d)(?:degrees?|cents?)$", "", s)
    if not s:
        return None
    try:
        if _PLAIN_NUMBER_RE.fullmatch(s):
            return Fraction(s.replace(",", "")), percent
        m = re.fullmatch(r"([-+]?[\d.]+)/([-+]?[\d.]+)", s)
        if m:
            den = Fraction(m.group(2))
            return (Fraction(m.group(1)) / den, percent) if den != 0 else None
        m = _LATEX_FRAC_NUM_RE.fullmatch(s)
        if m:
            den = Fraction(m.group(3))
            if den == 0:
                return None
            value = Fraction(m.group(2)) / den
            return (-value if m.group(1) == "-" else value), percent
        m = _MIXED_NUM_RE.fullmatch(s)
        if m and int(m.group(4)) != 0:
            value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
            return (-value if m.group(1) == "-" else value), percent
    except (ValueError, ZeroDivisionError, ArithmeticError):
        return None
    return None


def _math_verify_equal(pred: str, gold: str) -> bool:
    """Symbolic equality by math-verify, run without signal-based timeouts (thread-safe)."""
    gold_tex = "$" + plain_letters(gold).replace("$", " ").strip() + "$"
    pred_tex = "$" + plain_letters(pred).replace("$", " ").strip() + "$"
    if not (safe_for_sympy(gold_tex) and safe_for_sympy(pred_tex)):
        return False
    try:
        from math_verify import parse, verify
    except ImportError:  # pragma: no cover - math-verify is a dependency
        logger.warning("math-verify is not installed: LaTeX answers are compared as strings only")
        return False
    try:
        gold_parsed = parse(gold_tex, parsing_timeout=None)
        pred_parsed = parse(pred_tex, parsing_timeout=None)
        if not gold_parsed or not pred_parsed:
            return False
        # an interval gold matches the same set written as an inequality (x \\in [-2,7] ~ -2 \\le x \\le 7)
        return bool(verify(gold_parsed, pred_parsed, allow_set_relation_comp=True, timeout_seconds=None))
    except Exception:  # math-verify/sympy may raise anything on odd input
        logger.debug("math-verify failed on pred=%r gold=%r", pred, gold, exc_info=True)
        return False


def _decimal_comma_twins(a: str, b: str) -> bool:
    """"1,22" and "1.22": one side a decimal comma, the other the same digits with a point."""
    for comma, point in ((a, b), (b, a)):
        if _DECIMAL_COMMA_RE.fullmatch(comma) and point == comma.replace(",", "."):
            return True
    return False


_BASE_NUMBER_RE = re.compile(r"([0-9A-Za-z]+)_\{?(\d+)\}?")


def _base_number(norm: str) -> tuple[str, int] | None:
    """(digits, base) of a normalized number written in a base ("204_5", "204_{5}"), else None."""
    m = _BASE_NUMBER_RE.fullmatch(norm)
    return (m.group(1).upper(), int(m.group(2))) if m else None


def _base_value(digits: str, base: int) -> int | None:
    try:
        return int(digits, base) if 2 <= base <= 36 else None
    except ValueError:  # a digit the base does not have ("29_8")
        return None


def _based_equal(norm_pred: str, norm_gold: str) -> bool | None:
    """A gold number in a base against the prediction, None when the gold has no base. The base
    is part of the answer: "204_6" is not "204_5" (math-verify drops the subscript), "54_{10}" is
    (the same number); digits without a base are read in the gold's base ("204" for "204_5")."""
    gold = _base_number(norm_gold)
    if gold is None:
        return None
    pred = _base_number(norm_pred)
    if pred is None:
        return re.fullmatch(r"[0-9A-Za-z]+", norm_pred) is not None and norm_pred.upper() == gold[0]
    if pred == gold:
        return True
    value = _base_value(*gold)
    return value is not None and value == _base_value(*pred)


def _is_correct_latex(pred: str, gold: str) -> bool:
    # "7 3/4" is the mixed number 31/4, not 73/4 (which normalizing away its space would make it)
    pred, gold = improper_fraction(pred), improper_fraction(gold)
    norm_pred, norm_gold = normalize_latex(pred), normalize_latex(gold)
    if norm_gold and norm_pred == norm_gold:
        return True
    based = _based_equal(norm_pred, norm_gold)
    if based is not None:
        return based
    if _decimal_comma_twins(norm_pred, norm_gold):
        return True
    # words ("Evelyn", "even") compare case-insensitively; single letters (variables) do not
    if re.fullmatch(r"[A-Za-z]{2,}", norm_gold) and norm_pred.lower() == norm_gold.lower():
        return True
    if re.fullmatch(r"[A-Za-z]", norm_gold):
        return False  # an option letter or a variable: math-verify would ignore its case
    # "x=5" vs "5": an assignment on one side only is compared by its right-hand side
    var_pred, rhs_pred = _split_assignment(norm_pred)
    var_gold, rhs_gold = _split_assignment(norm_gold)
    if (var_pred is None) != (var_gold is None) and rhs_gold and rhs_pred == rhs_gold:
        return True
    g = _latex_number(gold)
    if g is not None:
        p = _latex_number(pred)
        if p is not None:
            return _numbers_equal(p, g)
    return _math_verify_equal(pred, gold)


# ----------------------------------------------------------------------------------------------
# public API


def is_correct(pred: str | None, gold: str, kind: str = "number", options: list[str] | None = None) -> bool:
    """Whether the extracted answer `pred` equals the gold answer `gold`.

    kind: one of ANSWER_KINDS ("number", "latex", "choice", "text", "none"). `options` are the
    multiple-choice options ("A)21", ...) used to map a non-letter prediction to its letter.
    Never raises on any pred/gold string; an unknown kind is a ValueError.
    """
    if kind not in ANSWER_KINDS:
        raise ValueError(f"kind must be one of {ANSWER_KINDS}, got {kind!r}")
    if kind == "none" or not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if not pred.strip() or not gold.strip():
        return False
    try:
        if kind == "number":
            return _is_correct_number(pred, gold)
        if kind == "latex":
            return _is_correct_latex(pred, gold)
        if kind == "choice":
            return _is_correct_choice(pred, gold, options)
        return _is_correct_text(pred, gold)
    except Exception:  # a grader must not crash an evaluation on odd text
        logger.debug("grading failed on pred=%r gold=%r kind=%s", pred, gold, kind, exc_info=True)
        return False


def grade(output_text: str, problem: Problem) -> GradeResult:
    """Extract the final answer of a model output and grade it against `problem.answer`."""
    kind = problem.answer_kind
    extracted = extract_answer(output_text, kind)
    if extracted is None:
        return GradeResult(correct=False, extracted=None, parsed=False)
    correct = is_correct(extracted, problem.answer, kind, problem.options)
    return GradeResult(correct=correct, extracted=extracted, parsed=True)
