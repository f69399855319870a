"""The files a run writes and reads back (reasoning/jsonl.py): atomic whole-file writes, JSONL rows,
and the rows of a file a run appends to."""

import json

import pytest

from reasoning.jsonl import atomic_write, read_resumable_jsonl, write_jsonl


def test_atomic_write_replaces_the_file_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text("old")
    atomic_write(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"id": "a"}])

    def rows():
        yield {"id": "b"}
        raise KeyboardInterrupt  # a kill half-way through producing the rows

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, rows())
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"id": "a"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_write_jsonl_takes_the_callers_encoder(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"q": "ä"}], dumps=lambda row: json.dumps(row, ensure_ascii=False))
    assert path.read_text(encoding="utf-8") == '{"q": "ä"}\n'


class RunError(ValueError):
    pass


def test_resumable_rows_drop_a_partial_last_line_and_name_a_bad_one(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c"')
    assert read_resumable_jsonl(path, RunError, "pass --overwrite") == ([(1, {"id": "a"}), (2, {"id": "b"})], True)
    assert read_resumable_jsonl(tmp_path / "none.jsonl", RunError, "x") == ([], False)
    path.write_text('{"id": "a"}\nnot json\n{"id": "c"}\n')
    with pytest.raises(RunError, match=r"results.jsonl:2: invalid JSON .*; pass --overwrite$"):
        read_resumable_jsonl(path, RunError, "pass --overwrite")
