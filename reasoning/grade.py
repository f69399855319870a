"""Grade a predictions file against a benchmark file.

    python -m reasoning.grade --data ../shared/data/math500_test.jsonl --predictions preds.jsonl \\
        [--out graded.jsonl] [--kind latex]

Prediction rows are `{"id": ..., "prediction": ...}`; a prediction is a full model output or a
bare answer (`null` counts as an output with no answer). The answer kind comes from the registry
when the data file name is a registry file name (ASDiv rows per row), else from --kind, else
from each row's `answer_kind` field, else "number".

Prints a JSON summary: n (predictions graded), correct, accuracy, unparsed (no answer found),
missing (data ids without a prediction), unknown_ids (prediction ids not in the data, skipped),
duplicates (repeated prediction ids, the first one is graded). --out writes one row per graded
prediction: id, prediction, extracted, gold, correct.
Exit status 0 on success, 2 on usage or data errors (message on stderr), among them an empty
data or predictions file and predictions none of whose ids is in the data (nothing graded).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from reasoning.benchmarks import DatasetError, iter_jsonl_objects, load_jsonl_problems, spec_for_filename
from reasoning.grading import grade
from reasoning.types import ANSWER_KINDS


def load_predictions(path: str | Path) -> list[tuple[int, str, str | None]]:
    """(line number, id, prediction) of every row of a predictions JSONL file.

    Raises DatasetError naming the file and line for bad JSON, a non-object row, a missing or
    non-string/int id, or a prediction that is neither a string nor null.
    """
    path = Path(path)
    rows: list[tuple[int, str, str | None]] = []
    for lineno, where, row in iter_jsonl_objects(path):
        if "id" not in row or "prediction" not in row:
            missing = [k for k in ("id", "prediction") if k not in row]
            raise DatasetError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
        pid, prediction = row["id"], row["prediction"]
        if isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise DatasetError(f"{where}: 'id' must be a string, got {type(pid).__name__}")
        if prediction is not None and not isinstance(prediction, str):
            raise DatasetError(
                f"{where}: 'prediction' must be a string or null, got {type(prediction).__name__}"
            )
        rows.append((lineno, str(pid), prediction))
    return rows


def grade_files(
    data: str | Path, predictions: str | Path, out: str | Path | None = None, kind: str | None = None
) -> dict[str, Any]:
    """Grade a predictions file against a data file; return the summary (see module docstring)."""
    spec = spec_for_filename(data)
    if spec is not None:
        if kind is not None and kind != spec.answer_kind:
            print(
                f"warning: {Path(data).name} is the registry benchmark {spec.name!r}; "
                f"grading as {spec.answer_kind!r}, not --kind {kind!r}",
                file=sys.stderr,
            )
        problems = load_jsonl_problems(data, spec.kind_for_row)
    else:
        problems = load_jsonl_problems(data, kind)
    if not problems:
        raise DatasetError(f"{data}: no problems (the file is empty)")
    by_id = {p.id: p for p in problems}
    preds = load_predictions(predictions)
    if not preds:
        raise DatasetError(f"{predictions}: no predictions (the file is empty)")
    if out is not None and Path(out).is_dir():
        raise DatasetError(f"--out {out}: is a directory, expected a file path")

    seen: set[str] = set()
    graded: list[dict[str, Any]] = []
    kinds: Counter[str] = Counter()
    unknown = duplicates = unparsed = correct = 0
    for _lineno, pid, prediction in preds:
        problem = by_id.get(pid)
        if problem is None:
            unknown += 1
            continue
        if pid in seen:
            duplicates += 1
            continue
        seen.add(pid)
        result = grade(prediction or "", problem)
        kinds[problem.answer_kind] += 1
        unparsed += not result.parsed
        correct += result.correct
        graded.append(
            {
                "id": pid,
                "prediction": prediction,
                "extracted": result.extracted,
                "gold": problem.answer,
                "correct": result.correct,
            }
        )

    n = len(graded)
    if n == 0:
        raise DatasetError(
            f"{predictions}: none of its {len(preds)} prediction ids is an id of {data}; nothing graded"
        )
    if out is not None:
        _write_rows(Path(out), graded)

    return {
        "data": str(data),
        "predictions": str(predictions),
        "benchmark": spec.name if spec is not None else None,
        "kinds": dict(sorted(kinds.items())),
        "n": n,
        "correct": correct,
        "accuracy": correct / n,
        "unparsed": unparsed,
        "missing": len(by_id) - len(seen),
        "unknown_ids": unknown,
        "duplicates": duplicates,
    }


def _write_rows(out: Path, rows: list[dict[str, Any]]) -> None:
    """Write JSONL rows through `OUT.tmp`, replaced into place; no `.tmp` is left on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reasoning.grade",
        description="Grade model predictions ({id, prediction} JSONL) against a benchmark JSONL file.",
    )
    parser.add_argument("--data", required=True, help="benchmark JSONL file (id, question, answer, ...)")
    parser.add_argument("--predictions", required=True, help="predictions JSONL file: {id, prediction} rows")
    parser.add_argument("--out", default=None, help="write one graded row per prediction to this JSONL file")
    parser.add_argument(
        "--kind",
        choices=ANSWER_KINDS,
        default=None,
        help="answer kind when the data file is not a registry benchmark (default: row field, else number)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = grade_files(args.data, args.predictions, args.out, args.kind)
    except (DatasetError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
