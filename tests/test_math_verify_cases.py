"""Math-Verify's own regression cases, graded by `reasoning.grading.grade`.

The cases in `tests/data/math_verify_cases.jsonl` are the (gold, prediction, expected verdict)
triples of the test suite of huggingface/Math-Verify (commit 5d148cfaaf99214c2e4ffb4bc497ab042c592a7a,
files `tests/test_all.py`, `test_boxed.py`, `test_numina_cases.py`, `test_open_thoughts.py`,
`test_strict.py`, `test_yujianll.py`); each row's `source` names the file and line it comes
from. Written as data, not code. Left out: `test_string_extraction.py` (option letters, not a
gold/prediction pair) and the two cases whose verdict holds only under a non-default option
that contradicts another case of the same pair (`strict=False`; `allow_set_relation_comp=False`
for a set gold against the same inequality). That leaves 267 cases.

The gold is given as a dataset stores it: `$...$` / `$$...$$` wrappers dropped, and for a gold
written as a whole solution, its boxed answer. The model output (`output`) is the prediction as
the source has it. One expectation is corrected (see the row's `note`): the source expects
`1 + 1/e` to match `1 - 1/e`, which documents a truncation in math-verify, not a right answer.

A row's `options` records the source's non-default comparison option (a rounding precision, the
set-relation flag); `grade()` has no such options, so those rows are graded as written.

    python -m pytest -q -s tests/test_math_verify_cases.py   # prints the agreement count
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reasoning.grading import grade
from reasoning.types import Problem

CASES_FILE = Path(__file__).resolve().parent / "data" / "math_verify_cases.jsonl"
MIN_AGREE = 260


def load_cases() -> list[dict]:
    with CASES_FILE.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def grade_cases(cases: list[dict]) -> list[tuple[dict, bool, str | None]]:
    """(case, verdict, extracted answer) for every case, graded as a MATH-style (latex) answer."""
    results = []
    for i, case in enumerate(cases):
        problem = Problem(id=str(i), question="", answer=case["gold"], answer_kind="latex")
        result = grade(case["output"], problem)
        results.append((case, result.correct, result.extracted))
    return results


@pytest.fixture(scope="module")
def graded():
    return grade_cases(load_cases())


def test_case_file_is_complete():
    cases = load_cases()
    assert len(cases) == 267
    assert all(isinstance(c["gold"], str) and c["gold"] and isinstance(c["expected"], bool) for c in cases)


def test_math_verify_cases_agree_without_false_accepts(graded):
    agree = sum(verdict == case["expected"] for case, verdict, _ in graded)
    false_accepts = [(c["source"], c["gold"], x) for c, verdict, x in graded if verdict and not c["expected"]]
    false_rejects = [(c["source"], c["gold"], x) for c, verdict, x in graded if not verdict and c["expected"]]
    print(f"\nMath-Verify cases: {agree} of {len(graded)} agree, "
          f"{len(false_accepts)} false accepts, {len(false_rejects)} false rejects")
    for source, gold, extracted in false_accepts + false_rejects:
        print(f"  disagree {source}: gold={gold!r} extracted={extracted!r}")
    assert false_accepts == []
    assert agree >= MIN_AGREE, false_rejects
