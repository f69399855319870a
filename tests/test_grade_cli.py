"""`python -m reasoning.grade` end to end, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_grade(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reasoning.grade", *args],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


@pytest.fixture
def dataset(tmp_path) -> Path:
    return write_jsonl(
        tmp_path / "toy.jsonl",
        [
            {"id": "q1", "question": "3 * 360?", "answer": "1080"},
            {"id": "q2", "question": "half of 3?", "answer": "1.5"},
            {"id": "q3", "question": "50 percent?", "answer": "0.5"},
            {"id": "q4", "question": "7 - 9?", "answer": "-2"},
            {"id": "q5", "question": "no prediction for me", "answer": "1"},
        ],
    )


def test_summary_and_graded_rows(tmp_path, dataset):
    predictions = write_jsonl(
        tmp_path / "preds.jsonl",
        [
            {
                "id": "q1",
                "prediction": "<Step>3 * 360 = 1,080</Step>\n<Step>The answer is <ans>1,080</ans>.</Step>",
            },
            {"id": "q2", "prediction": "3/2"},
            {"id": "q3", "prediction": "I do not know."},
            {"id": "q1", "prediction": "The answer is 7."},  # duplicate: ignored
            "",
            {"id": "zz", "prediction": "5"},  # unknown id
            {"id": "q4", "prediction": "The answer is 2."},
        ],
    )
    out = tmp_path / "graded" / "rows.jsonl"
    result = run_grade("--data", str(dataset), "--predictions", str(predictions), "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {
        k: summary[k]
        for k in ("n", "correct", "accuracy", "unparsed", "missing", "unknown_ids", "duplicates")
    } == {
        "n": 4,
        "correct": 2,
        "accuracy": 0.5,
        "unparsed": 1,
        "missing": 1,
        "unknown_ids": 1,
        "duplicates": 1,
    }
    assert summary["kinds"] == {"number": 4}
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["extracted"], r["gold"], r["correct"]) for r in rows] == [
        ("q1", "1,080", "1080", True),
        ("q2", "3/2", "1.5", True),
        ("q3", None, "0.5", False),
        ("q4", "2", "-2", False),
    ]
    assert rows[1]["prediction"] == "3/2"


def test_kind_flag_and_registry_file_names(tmp_path):
    rows = [
        {"id": "m1", "question": "q", "answer": r"\frac{1}{2}"},
        {"id": "m2", "question": "q", "answer": "(3,4]"},
    ]
    preds = write_jsonl(
        tmp_path / "p.jsonl",
        [{"id": "m1", "prediction": r"so $\boxed{0.5}$"}, {"id": "m2", "prediction": r"\boxed{(3, 4]}"}],
    )
    custom = write_jsonl(tmp_path / "custom.jsonl", rows)
    as_latex = json.loads(
        run_grade("--data", str(custom), "--predictions", str(preds), "--kind", "latex").stdout
    )
    assert (as_latex["n"], as_latex["correct"], as_latex["kinds"]) == (2, 2, {"latex": 2})
    # the registry file name makes it latex without --kind
    registry = write_jsonl(tmp_path / "math500_test.jsonl", rows)
    result = run_grade("--data", str(registry), "--predictions", str(preds))
    summary = json.loads(result.stdout)
    assert (summary["benchmark"], summary["correct"], summary["kinds"]) == ("math500", 2, {"latex": 2})
    # without either, the answers are read as numbers: "(3,4]" is not one
    as_number = json.loads(run_grade("--data", str(custom), "--predictions", str(preds)).stdout)
    assert (as_number["kinds"], as_number["correct"]) == ({"number": 2}, 1)


def test_empty_files_and_nothing_graded_exit_2(tmp_path, dataset):
    """An empty file, or predictions that match no data id, are errors, not an n=0 summary."""
    empty = write_jsonl(tmp_path / "none.jsonl", [""])
    preds = write_jsonl(tmp_path / "p.jsonl", [{"id": "q1", "prediction": "1080"}])
    unknown = write_jsonl(tmp_path / "unknown.jsonl", [{"id": "zz", "prediction": "1080"}])
    for args, message in [
        (("--data", str(dataset), "--predictions", str(empty)), "none.jsonl: no predictions"),
        (("--data", str(empty), "--predictions", str(preds)), "none.jsonl: no problems"),
        (("--data", str(dataset), "--predictions", str(unknown)), "nothing graded"),
    ]:
        result = run_grade(*args)
        assert result.returncode == 2, result.stdout
        assert message in result.stderr
        assert result.stdout == ""


def test_out_failure_leaves_no_tmp_file(tmp_path, dataset):
    preds = write_jsonl(tmp_path / "p.jsonl", [{"id": "q1", "prediction": "1080"}])
    out_dir = tmp_path / "graded"
    out_dir.mkdir()
    result = run_grade("--data", str(dataset), "--predictions", str(preds), "--out", str(out_dir))
    assert result.returncode == 2 and "is a directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graded", "p.jsonl", "toy.jsonl"]


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ('{"id": "q1", "prediction": ', "invalid JSON"),
        ('{"prediction": "5"}', "missing field(s) 'id'"),
        ('{"id": "q1"}', "missing field(s) 'prediction'"),
        ('{"id": ["q1"], "prediction": "5"}', "'id' must be a string"),
        ('{"id": "q1", "prediction": 5}', "'prediction' must be a string or null"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_prediction_rows_fail_with_file_and_line(tmp_path, dataset, bad_row, message):
    preds = write_jsonl(tmp_path / "bad_preds.jsonl", [{"id": "q1", "prediction": "1080"}, "", bad_row])
    result = run_grade("--data", str(dataset), "--predictions", str(preds))
    assert result.returncode == 2
    assert "bad_preds.jsonl:3:" in result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_data_errors_and_usage_errors_exit_2(tmp_path, dataset):
    preds = write_jsonl(tmp_path / "p.jsonl", [{"id": "q1", "prediction": "1080"}])
    bad_data = write_jsonl(
        tmp_path / "bad_data.jsonl", [{"id": "a", "question": "q", "answer": "1"}, {"id": "a"}]
    )
    result = run_grade("--data", str(bad_data), "--predictions", str(preds))
    assert result.returncode == 2 and "bad_data.jsonl:2:" in result.stderr
    result = run_grade("--data", str(tmp_path / "absent.jsonl"), "--predictions", str(preds))
    assert result.returncode == 2 and "absent.jsonl" in result.stderr
    result = run_grade("--data", str(dataset))
    assert result.returncode == 2 and "--predictions" in result.stderr
    result = run_grade("--data", str(dataset), "--predictions", str(preds), "--kind", "numeric")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_write_rows_removes_its_tmp_file_when_writing_fails(tmp_path):
    from reasoning.grade import _write_rows

    out = tmp_path / "rows.jsonl"
    with pytest.raises(TypeError):
        _write_rows(out, [{"id": "q1"}, {"id": {"not", "json"}}])
    assert list(tmp_path.iterdir()) == []
    _write_rows(out, [{"id": "q1"}])
    assert out.read_text(encoding="utf-8") == '{"id": "q1"}\n'
    assert list(tmp_path.iterdir()) == [out]
