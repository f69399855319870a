"""Hostile input files and model output: nesting too deep for `json`, numbers too long for `int`.

Each reader a CLI uses for JSONL names the file and line of such a line instead of a traceback;
model output with a number too long to convert is a wrong step, never a crash."""

import json

import pytest

from reasoning import grade
from reasoning.benchmarks import DatasetError, iter_jsonl_objects, load_jsonl_problems, read_appended_jsonl
from reasoning.json_input import JSONInputError, loads
from reasoning.jsonl import read_jsonl

DEEP = "[" * 100_000
LONG_INT = '{"id": "x", "question": "q", "answer": ' + "9" * 5000 + "}"


def _file(tmp_path, bad: str, good: dict | None = None):
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps(good or {"id": "a", "question": "q", "answer": "1"}) + "\n" + bad + "\n")
    return path


def test_loads_turns_recursion_and_digit_limits_into_value_errors():
    for text, reason in ((DEEP, "nested too deeply"), ("9" * 5000, "integer"), ("{", "column")):
        with pytest.raises(JSONInputError, match=reason):
            loads(text)


@pytest.mark.parametrize("bad", [DEEP, '{"a": ' * 50_000, LONG_INT], ids=["array", "object", "long_int"])
@pytest.mark.parametrize("reader", [
    load_jsonl_problems,  # rl/ppo_step.py (--dataset x.jsonl), load_benchmark by path: inference.evaluate
    lambda p: list(iter_jsonl_objects(p)),  # reasoning.grade --predictions
    read_appended_jsonl,  # inference.evaluate and reward_models.annotate resuming their output
    read_jsonl,  # reward_models.verifier_metrics --data, reward_models.train --data
], ids=["problems", "objects", "appended", "reward_models"])
def test_every_jsonl_reader_names_file_and_line(tmp_path, reader, bad):
    with pytest.raises(DatasetError, match=r"hostile\.jsonl:2: invalid JSON"):
        reader(_file(tmp_path, bad))


def test_grade_cli_reports_a_deep_line_and_exits_2(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "q", "answer": "1"}) + "\n")
    preds = _file(tmp_path, DEEP, {"id": "a", "prediction": "1"})
    assert grade.main(["--data", str(data), "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err
    assert "hostile.jsonl:2: invalid JSON (nested too deeply)" in err and "Traceback" not in err


BIG = "9" * 4301  # one digit past Python's int conversion limit


def _world_problem():
    from reasoning.world import generate, row_to_problem

    return row_to_problem(generate("test", 1, 0)[0])


def _with_big_number(steps: list[str], i: int) -> list[str]:
    import re

    last = i == len(steps) - 1
    text = re.sub(r"<ans>[^<]*</ans>", f"<ans>{BIG}</ans>", steps[i]) if last else \
        re.sub(r"= -?[0-9]+ ", f"= {BIG} ", steps[i])
    return [*steps[:i], text, *steps[i + 1:]]


def test_world_checker_counts_a_number_too_long_as_a_wrong_step():
    from reasoning.steps import split_steps
    from reasoning.world import check_steps, earliest_error, error_kind, gold_solution

    problem = _world_problem()
    steps = split_steps(gold_solution(problem)).steps
    for i in range(len(steps)):
        path = _with_big_number(steps, i)
        assert BIG in path[i]
        checks = check_steps(problem, path)
        assert (checks[i].ok, checks[i].kind) == (False, "format")
        assert earliest_error(problem, path) == i and error_kind(problem, path) == "format"
    operand = steps[0].replace(" has ", f" has {BIG} + ", 1)  # a long operand: wrong, not a crash
    assert not check_steps(problem, [operand, *steps[1:]])[0].ok


def test_evaluate_grades_a_completion_with_a_number_too_long():
    """`inference.evaluate`'s per-problem row (what a run and its re-run both compute)."""
    from inference.evaluate import _row
    from inference.methods.base import MethodOutput, Usage
    from reasoning.steps import join_steps, split_steps
    from reasoning.world import gold_solution

    problem = _world_problem()
    steps = split_steps(gold_solution(problem)).steps
    completion = join_steps(_with_big_number(steps, 0))
    row = _row(problem, MethodOutput(prediction=problem.answer, completion=completion, usage=Usage()), 0)
    assert row["error_kind"] == "format"
