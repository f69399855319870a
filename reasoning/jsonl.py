"""Files a run writes and reads back: whole files written atomically (a kill leaves the old file or
the new one, never half of one), JSONL rows, and the rows of a file a run appends to.

Reading untrusted JSONL (benchmarks, predictions, stepwise data) is `reasoning.benchmarks`'
`iter_jsonl_objects` / `read_appended_jsonl`, which name the file and line of a bad row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from reasoning.benchmarks import DatasetError, iter_jsonl_objects, read_appended_jsonl


def atomic_write(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to PATH.tmp, flush it to disk and move it into place; no .tmp is left behind."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any],
                dumps: Callable[[Any], str] = json.dumps) -> None:
    """One JSON line per row, written atomically (`dumps` turns a row into its line)."""
    atomic_write(path, "".join(dumps(row) + "\n" for row in rows))


def read_resumable_jsonl(path: str | os.PathLike[str], error: type[Exception],
                         fix: str) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, row) of every complete line of a file a run appends to, and whether a partial
    last line (a killed write) was dropped; a bad line anywhere else raises `error` naming the file
    and line, followed by `fix` (what the user can do)."""
    try:
        return read_appended_jsonl(path)
    except DatasetError as err:
        raise error(f"{err}; {fix}") from None


def read_jsonl(path: str | os.PathLike[str]) -> tuple[list[Any], list[int]]:
    """(rows, 1-based line numbers) of a JSONL file of objects; a bad line raises DatasetError
    naming the file and the line."""
    rows, lines = [], []
    for lineno, _, row in iter_jsonl_objects(str(path)):
        rows.append(row)
        lines.append(lineno)
    return rows, lines
