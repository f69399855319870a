"""The resumable output of an annotation: rows appended one problem at a time, then the problem
recorded as done, so that a killed run resumes and writes what an uninterrupted one writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from reasoning.jsonl import read_resumable_jsonl, write_jsonl
from reward_models.annotate.base import AnnotationError


def _read_jsonl_tolerant(path: Path) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, row) of every complete line, and whether a trailing partial line was dropped;
    a bad line anywhere else raises AnnotationError naming the file and line."""
    return read_resumable_jsonl(path, AnnotationError, "remove the file or pass --overwrite")


class ResumableWriter:
    """Appends the rows of one problem at a time, then records the problem as done."""

    def __init__(self, out: str | os.PathLike[str], settings: dict[str, Any], overwrite: bool = False):
        self.out = Path(out)
        self.done_path = self.out.with_name(self.out.name + ".done")
        self.meta_path = self.out.with_name(self.out.name + ".meta.json")
        self.settings = settings
        if overwrite:
            for p in (self.out, self.done_path, self.meta_path):
                p.unlink(missing_ok=True)
        self.done: dict[str, int] = {}
        self.dropped_rows = 0
        self.dropped_partial_lines = 0
        self._recover()
        self._rows_fh = self.out.open("a")
        self._done_fh = self.done_path.open("a")

    def _recover(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if self.meta_path.exists():
            old = json.loads(self.meta_path.read_text())
            if old != json.loads(json.dumps(self.settings)):
                changed = sorted(k for k in set(old) | set(self.settings)
                                 if old.get(k) != self.settings.get(k))
                raise AnnotationError(f"{self.out} was written with other settings ({', '.join(changed)}); "
                                      "pass --overwrite or choose another --out")
        elif self.out.exists() and self.out.stat().st_size > 0:
            raise AnnotationError(f"{self.out} exists but has no {self.meta_path.name}; pass --overwrite")
        else:
            self.meta_path.write_text(json.dumps(self.settings, indent=2))
        done_rows, done_partial = _read_jsonl_tolerant(self.done_path)
        recorded: dict[str, int] = {}
        for lineno, entry in done_rows:
            if not isinstance(entry.get("problem_id"), str) or not isinstance(entry.get("rows"), int):
                raise AnnotationError(f"{self.done_path}:{lineno}: expected "
                                      "{'problem_id': str, 'rows': int}")
            recorded[entry["problem_id"]] = entry["rows"]
        rows, rows_partial = _read_jsonl_tolerant(self.out)
        by_problem: dict[str, list[dict]] = {}
        for lineno, row in rows:
            if not isinstance(row.get("problem_id"), str) or not isinstance(row.get("id"), str):
                raise AnnotationError(f"{self.out}:{lineno}: row without a string 'id' and 'problem_id'")
            by_problem.setdefault(row["problem_id"], []).append(row)
        for pid, n in recorded.items():
            got = by_problem.get(pid, [])
            if len(got) == n and len({r["id"] for r in got}) == n:
                self.done[pid] = n
        keep = [row for _, row in rows if row["problem_id"] in self.done]
        self.dropped_rows = len(rows) - len(keep)
        self.dropped_partial_lines = int(rows_partial)
        if self.dropped_rows or rows_partial:
            write_jsonl(self.out, keep)
        if done_partial or len(self.done) != len(done_rows):
            write_jsonl(self.done_path, ({"problem_id": p, "rows": n} for p, n in self.done.items()))

    def write_problem(self, problem_id: str, rows: list[dict]) -> None:
        self._rows_fh.write("".join(json.dumps(r) + "\n" for r in rows))
        self._rows_fh.flush()
        os.fsync(self._rows_fh.fileno())
        self._done_fh.write(json.dumps({"problem_id": problem_id, "rows": len(rows)}) + "\n")
        self._done_fh.flush()
        os.fsync(self._done_fh.fileno())
        self.done[problem_id] = len(rows)

    def close(self) -> None:
        self._rows_fh.close()
        self._done_fh.close()


def summarize(out: Path) -> dict[str, Any]:
    """Counts, the mean label and (for world rows) the agreement with exact labels, over the file."""
    rows = steps = correct = 0
    label_sum = 0.0
    exact_steps = 0
    abs_err = 0.0
    agree = 0
    problems: set[str] = set()
    with out.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            rows += 1
            problems.add(row["problem_id"])
            correct += bool(row["answer_correct"])
            steps += len(row["labels"])
            label_sum += sum(row["labels"])
            if "exact_labels" in row:
                for label, exact in zip(row["labels"], row["exact_labels"]):
                    exact_steps += 1
                    abs_err += abs(label - exact)
                    agree += (label >= 0.5) == (exact >= 0.5)
    summary: dict[str, Any] = {
        "problems_with_rows": len(problems),
        "rows": rows,
        "steps": steps,
        "mean_label": label_sum / steps if steps else None,
        "answer_correct_rate": correct / rows if rows else None,
    }
    if exact_steps:
        summary["agreement"] = {"steps": exact_steps, "mae": abs_err / exact_steps,
                                "accuracy": agree / exact_steps}
    return summary
