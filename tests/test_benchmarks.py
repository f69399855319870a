"""The benchmark registry, the JSONL loader and its errors, and the shared data files."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from reasoning.answers import extract_answer
from reasoning.benchmarks import (
    BENCHMARKS,
    DatasetError,
    default_data_dir,
    load_benchmark,
    load_jsonl_problems,
)
from reasoning.grading import grade, is_correct
from reasoning.types import ANSWER_KINDS, Problem

EXPECTED_ROWS = {
    "gsm8k": 1319,
    "math500": 500,
    "svamp": 1000,
    "addsub": 395,
    "asdiv": 2305,
    "aqua": 254,
    "gsm_ic_2step": 1000,
    "gsm_ic_mstep": 1000,
    "processbench_gsm8k": 400,
    "processbench_math": 1000,
    "processbench_olympiadbench": 1000,
    "processbench_omnimath": 1000,
}


def write_jsonl(path: Path, rows: list) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# the registry itself


def test_registry_entries():
    assert set(BENCHMARKS) == set(EXPECTED_ROWS)
    for name, spec in BENCHMARKS.items():
        assert spec.name == name
        assert spec.filename.endswith(".jsonl")
        assert spec.answer_kind in ANSWER_KINDS
        assert spec.rows == EXPECTED_ROWS[name]
        if spec.hub_id is not None:
            assert "/" in spec.hub_id and spec.hub_fields is not None
    assert BENCHMARKS["math500"].answer_kind == "latex"
    assert BENCHMARKS["aqua"].answer_kind == "choice"
    assert all(BENCHMARKS[n].answer_kind == "none" for n in BENCHMARKS if n.startswith("processbench_"))
    assert (BENCHMARKS["gsm8k"].hub_id, BENCHMARKS["gsm8k"].hub_config, BENCHMARKS["gsm8k"].hub_split) == (
        "openai/gsm8k",
        "main",
        "test",
    )
    assert BENCHMARKS["processbench_math"].hub_split == "math"
    asdiv = BENCHMARKS["asdiv"]
    assert asdiv.kind_for_row({"answer_is_number": True}) == "number"
    assert asdiv.kind_for_row({"answer_is_number": False}) == "text"


def test_default_data_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPRL_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("STEPRL_DATA_DIR")
    found = default_data_dir()
    expected = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    assert found == (expected if expected.is_dir() else None)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'") as info:
        load_benchmark("gsm9k")
    assert "gsm8k" in str(info.value) and "processbench_omnimath" in str(info.value)


def test_bad_source_is_rejected():
    with pytest.raises(ValueError, match="source"):
        load_benchmark("gsm8k", source="web")


# ----------------------------------------------------------------------------------------------
# the JSONL loader


def test_load_jsonl_problems_schema(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"id": "a", "question": "1+1?", "answer": "2", "level": 1},
            "",
            "   ",
            {
                "id": "b",
                "question": "pick",
                "answer": "C",
                "answer_kind": "choice",
                "options": ["A)1", "C)3"],
            },
        ],
    )
    problems = load_jsonl_problems(path)
    assert problems == [
        Problem(id="a", question="1+1?", answer="2", answer_kind="number", meta={"level": 1}),
        Problem(id="b", question="pick", answer="C", answer_kind="choice", options=["A)1", "C)3"], meta={}),
    ]
    assert [p.answer_kind for p in load_jsonl_problems(path, answer_kind="text")] == ["text", "text"]
    assert [p.id for p in load_jsonl_problems(path, limit=1)] == ["a"]
    assert load_jsonl_problems(path, limit=0) == []


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "x", "question": "q", "answer": ', "invalid JSON"),
        ('["id", "question", "answer"]', "expected a JSON object"),
        ('{"question": "q", "answer": "1"}', "missing field 'id'"),
        ('{"id": "x", "answer": "1"}', "missing field 'question'"),
        ('{"id": "x", "question": "q"}', "missing field 'answer'"),
        ('{"id": 7, "question": "q", "answer": "1"}', "field 'id' must be a string"),
        ('{"id": "x", "question": "q", "answer": 1}', "field 'answer' must be a string"),
        ('{"id": "a", "question": "again", "answer": "1"}', "duplicate id 'a' (first on line 1)"),
        (
            '{"id": "x", "question": "q", "answer": "1", "answer_kind": "numeric"}',
            "answer_kind must be one of",
        ),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, bad_line, message):
    good = {"id": "a", "question": "q", "answer": "1"}
    path = write_jsonl(
        tmp_path / "broken_file.jsonl", [good, "", {"id": "b", "question": "q", "answer": "2"}, bad_line]
    )
    with pytest.raises(DatasetError) as info:
        load_jsonl_problems(path)
    text = str(info.value)
    assert "broken_file.jsonl:4:" in text
    assert message in text
    assert isinstance(info.value, ValueError)


def test_non_utf8_line_names_file_and_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(
        b'{"id": "a", "question": "q", "answer": "1"}\n{"id": "b", "question": "caf\xe9", "answer": "1"}\n'
    )
    with pytest.raises(DatasetError, match=r"latin\.jsonl:2: not UTF-8"):
        load_jsonl_problems(path)


def test_load_benchmark_by_path_infers_kind(tmp_path):
    plain = write_jsonl(tmp_path / "custom.jsonl", [{"id": "1", "question": "q", "answer": "5"}])
    assert load_benchmark(str(plain))[0].answer_kind == "number"
    tagged = write_jsonl(
        tmp_path / "tagged.jsonl", [{"id": "1", "question": "q", "answer": "x", "answer_kind": "text"}]
    )
    assert load_benchmark(tagged)[0].answer_kind == "text"
    # a file named like a registry file is graded like that benchmark
    math = write_jsonl(tmp_path / "math500_test.jsonl", [{"id": "1", "question": "q", "answer": r"\frac12"}])
    assert load_benchmark(math)[0].answer_kind == "latex"
    with pytest.raises(FileNotFoundError):
        load_benchmark(str(tmp_path / "absent.jsonl"))


# ----------------------------------------------------------------------------------------------
# the Hub path, with a fake `datasets` (tests never touch the network)


@pytest.fixture
def fake_datasets(monkeypatch):
    calls: list[tuple] = []
    rows_by_id = {
        "openai/gsm8k": [
            {"question": "How many?", "answer": "3 * 360 = <<3*360=1080>>1080\n#### 1,080"},
            {"question": "Below zero?", "answer": "#### -4"},
        ],
        "deepmind/aqua_rat": [
            {"question": "Pick", "options": ["A)1", "B)2"], "rationale": "r", "correct": "B"},
        ],
        "EleutherAI/asdiv": [
            {"body": "Seven and two.", "question": "How many?", "answer": "9 (apples)", "formula": "7+2=9"},
            {
                "body": "Ages.",
                "question": "How old?",
                "answer": "32 (years old); 20 (years old)",
                "formula": "",
            },
        ],
    }

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return rows_by_id[path]

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_hub_rows_become_problems(fake_datasets, tmp_path):
    problems = load_benchmark("gsm8k", data_dir=tmp_path)  # empty dir: no local file
    assert fake_datasets == [("openai/gsm8k", "main", "test")]
    assert [(p.id, p.question, p.answer, p.answer_kind) for p in problems] == [
        ("gsm8k-test-0", "How many?", "1080", "number"),
        ("gsm8k-test-1", "Below zero?", "-4", "number"),
    ]
    aqua = load_benchmark("aqua", data_dir=tmp_path, source="hub")
    assert aqua[0].answer == "B" and aqua[0].options == ["A)1", "B)2"] and aqua[0].answer_kind == "choice"
    assert aqua[0].meta == {"rationale": "r"}
    asdiv = load_benchmark("asdiv", data_dir=tmp_path)
    assert [(p.question, p.answer, p.answer_kind) for p in asdiv] == [
        ("Seven and two. How many?", "9", "number"),
        ("Ages. How old?", "32; 20", "text"),
    ]


def test_local_file_wins_and_hub_is_not_touched(fake_datasets, tmp_path):
    write_jsonl(tmp_path / "gsm8k_test.jsonl", [{"id": "gsm8k-test-0", "question": "q", "answer": "7"}])
    problems = load_benchmark("GSM8K", data_dir=tmp_path)
    assert [p.answer for p in problems] == ["7"]
    assert fake_datasets == []


def test_local_source_never_goes_to_the_hub(fake_datasets, tmp_path):
    with pytest.raises(FileNotFoundError, match="gsm8k_test.jsonl"):
        load_benchmark("gsm8k", data_dir=tmp_path, source="local")
    assert fake_datasets == []


def test_benchmark_without_hub_copy_says_so(fake_datasets, tmp_path):
    with pytest.raises(FileNotFoundError, match="no Hub copy"):
        load_benchmark("gsm_ic_2step", data_dir=tmp_path)
    assert fake_datasets == []


# ----------------------------------------------------------------------------------------------
# the shared data files


@pytest.fixture(scope="module")
def data_dir() -> Path:
    found = default_data_dir()
    if found is None or not found.is_dir():
        pytest.skip(f"../shared/data not found: default_data_dir() returned {found} (set STEPRL_DATA_DIR)")
    return found


@pytest.fixture(scope="module")
def loaded(data_dir) -> dict[str, list[Problem]]:
    missing = [spec.filename for spec in BENCHMARKS.values() if not (data_dir / spec.filename).is_file()]
    if missing:
        pytest.skip(f"../shared/data is incomplete: {missing} not in {data_dir}")
    return {name: load_benchmark(name, data_dir=data_dir, source="local") for name in BENCHMARKS}


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_every_benchmark_loads_with_readme_row_counts(loaded, name):
    problems = loaded[name]
    assert len(problems) == EXPECTED_ROWS[name]
    assert len({p.id for p in problems}) == len(problems)
    spec = BENCHMARKS[name]
    if name != "asdiv":
        assert {p.answer_kind for p in problems} == {spec.answer_kind}


def test_kinds_and_fields_of_special_benchmarks(loaded):
    asdiv = loaded["asdiv"]
    assert sum(p.answer_kind == "number" for p in asdiv) == 2084
    assert sum(p.answer_kind == "text" for p in asdiv) == 221
    assert all(p.options is not None and len(p.options) == 5 for p in loaded["aqua"])
    assert all(p.answer in "ABCDE" for p in loaded["aqua"])
    for name in ("processbench_gsm8k", "processbench_math"):
        assert all(p.answer == "" and isinstance(p.meta["steps"], list) for p in loaded[name])
    assert loaded["math500"][0].answer == r"\left( 3, \frac{\pi}{2} \right)"


@pytest.mark.parametrize("name", ["gsm8k", "svamp", "addsub", "gsm_ic_2step", "gsm_ic_mstep"])
def test_numeric_gold_answers_grade_against_themselves(loaded, name):
    failures = []
    for p in loaded[name]:
        output = f"<Step>So.</Step>\n<Step>The answer is <ans>{p.answer}</ans>.</Step>"
        if not (is_correct(p.answer, p.answer, p.answer_kind) and grade(output, p).correct):
            failures.append((p.id, p.answer))
    assert failures == []


def test_asdiv_gold_answers_grade_against_themselves(loaded):
    problems = loaded["asdiv"]
    failures = [
        (p.id, p.answer, p.answer_kind) for p in problems if not is_correct(p.answer, p.answer, p.answer_kind)
    ]
    # known: asdiv-nluds-1331 has answer "-" (its raw answer "-(1/3)" lost the parenthesis)
    assert len(failures) <= 0.01 * len(problems), failures


def test_math500_gold_answers_grade_against_themselves(loaded):
    problems = loaded["math500"]
    failures = []
    for p in problems:
        boxed = f"So the answer is $\\boxed{{{p.answer}}}$."
        if not (is_correct(p.answer, p.answer, "latex") and grade(boxed, p).correct):
            failures.append((p.id, p.answer))
    assert len(failures) <= 0.01 * len(problems), f"{len(failures)} gold answers fail: {failures}"


def test_math500_reference_solutions_grade_correct(loaded):
    """The boxed answer of each reference solution is extracted and graded against the gold."""
    problems = loaded["math500"]
    failures = [
        (p.id, p.answer, extract_answer(p.meta["solution"], "latex"))
        for p in problems
        if not grade(p.meta["solution"], p).correct
    ]
    assert len(failures) <= 0.01 * len(problems), f"{len(failures)} solutions fail: {failures}"


def test_gsm8k_reference_solutions_grade_correct(loaded):
    failures = [(p.id, p.answer) for p in loaded["gsm8k"] if not grade(p.meta["solution"], p).correct]
    assert failures == []


def test_aqua_option_texts_map_to_their_letters(loaded):
    failures = []
    for p in loaded["aqua"]:
        texts = [o.split(")", 1)[1].strip() for o in p.options]
        if texts.count(p.meta["answer_option_text"].strip()) > 1:
            continue  # duplicated option text (3 rows): ambiguous by construction
        if not is_correct(p.meta["answer_option_text"], p.answer, "choice", p.options):
            failures.append((p.id, p.answer, p.meta["answer_option_text"]))
    assert failures == []
