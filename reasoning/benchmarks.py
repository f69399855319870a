"""The benchmark registry: which file (or Hub dataset) holds a benchmark and how it is graded.

Local files follow the uniform JSONL schema of `../shared/data/README.md`: every row has string
`id`, `question` and `answer`; every other key is kept in `Problem.meta` (`options` of AQuA goes
to `Problem.options`). `load_benchmark("gsm8k")` reads `<data dir>/gsm8k_test.jsonl`; without a
local file it can load the public Hub copy with `datasets` and map its rows to the same schema.

    problems = load_benchmark("math500", limit=50)
    problems = load_benchmark("path/to/my_problems.jsonl")
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoning.answers import find_boxed, parse_number
from reasoning.json_input import JSONInputError
from reasoning.json_input import loads as json_loads
from reasoning.types import ANSWER_KINDS, Problem

__all__ = [
    "BENCHMARKS",
    "is_benchmark_name",
    "benchmark_spec",
    "BenchmarkSpec",
    "DatasetError",
    "HubFields",
    "default_data_dir",
    "gold_answer",
    "load_benchmark",
    "load_jsonl_problems",
    "read_appended_jsonl",
]

DATA_DIR_ENV = "STEPRL_DATA_DIR"
SOURCES = ("auto", "local", "hub")


class DatasetError(ValueError):
    """A malformed dataset file or row; the message names the file and the 1-based line."""


# ----------------------------------------------------------------------------------------------
# answer post-processing for Hub rows


def canonical_number(value: Any) -> str:
    """A number written as in the local files: 51.0 -> "51", "1,080" -> "1080", 6.5 -> "6.5"."""
    if isinstance(value, bool):
        raise TypeError(f"not a number: {value!r}")
    if isinstance(value, int):
        return str(value)
    number = float(str(value).replace(",", "").strip()) if isinstance(value, str) else float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return str(int(number)) if number.is_integer() else repr(number)


def gold_answer(value: Any) -> str:
    """The gold answer of an answer field: a GSM8K solution "... #### 1,080" gives "1080", a MATH
    solution "... \\boxed{\\frac12}" gives "\\frac12", a number gives its canonical text, any
    other text is kept (stripped)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not an answer: {value!r}")
    if isinstance(value, int | float):
        return canonical_number(value)
    if not isinstance(value, str):
        raise ValueError(f"an answer must be text or a number, got {type(value).__name__}")
    text = value.strip()
    if "####" in text:
        answer = text.rsplit("####", 1)[1].strip()
        try:
            return canonical_number(answer)
        except ValueError:
            return answer.replace(",", "")
    boxed = find_boxed(text)
    if boxed is not None:
        return boxed.strip()
    return text


def _gsm8k_answer(value: Any) -> str:
    """GSM8K's solution text ends with "#### N": the answer is N without thousands commas."""
    text = str(value)
    if "####" not in text:
        raise ValueError("no '#### <answer>' line in the GSM8K solution")
    answer = text.rsplit("####", 1)[1].strip()
    try:
        return canonical_number(answer)
    except ValueError:
        return answer.replace(",", "")


def _asdiv_answer(value: Any) -> str:
    """ASDiv "32 (years old); 20 (years old)" -> "32; 20": unit parentheses dropped per part."""
    parts = [re.sub(r"\s*\([^()]*\)\s*$", "", part.strip()) for part in str(value).split(";")]
    return "; ".join(part.strip() for part in parts)


def _letter_answer(value: Any) -> str:
    return str(value).strip().upper()


def _strip_answer(value: Any) -> str:
    return str(value).strip()


def _number_answer(value: Any) -> str:
    try:
        return canonical_number(value)
    except (TypeError, ValueError):
        return str(value).strip()


def _no_answer(value: Any) -> str:
    return ""


ANSWER_TRANSFORMS: dict[str, Callable[[Any], str]] = {
    "strip": _strip_answer,
    "number": _number_answer,
    "gsm8k": _gsm8k_answer,
    "asdiv": _asdiv_answer,
    "letter": _letter_answer,
    "none": _no_answer,
}
"""How a Hub answer field becomes `Problem.answer`, by name (see `HubFields.answer_transform`)."""


@dataclass(frozen=True)
class HubFields:
    """Where a Hub dataset row keeps the fields of a `Problem`."""

    question: tuple[str, ...]
    """Field(s) of the question text; several are joined with a space (SVAMP: Body + Question)."""
    answer: str | None
    """Field of the gold answer; None when the dataset has none (ProcessBench)."""
    answer_transform: str = "strip"
    """Name in ANSWER_TRANSFORMS: strip, number, gsm8k ("#### N"), asdiv (units), letter, none."""
    id: str | None = None
    """Field of the row id; None: ids are "<id_prefix><row index>"."""
    id_prefix: str = ""
    """Prefix of the ids (also put before an id field's value when that is not already unique)."""
    options: str | None = None
    """Field of the multiple-choice options (AQuA)."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark: its local file, its answer kind and its public Hub copy."""

    name: str
    """Registry name, e.g. "gsm8k"."""
    filename: str
    """File name in the data directory, e.g. "gsm8k_test.jsonl"."""
    answer_kind: str
    """How answers are graded: one of ANSWER_KINDS."""
    hub_id: str | None
    """Hugging Face Hub dataset id of a public copy, or None when there is none."""
    hub_config: str | None = None
    """Hub dataset configuration name, if any."""
    hub_split: str = "test"
    """Hub split holding this benchmark."""
    hub_fields: HubFields | None = None
    """How a Hub row maps to a Problem."""
    text_kind_field: str | None = None
    """Boolean row field; rows where it is false are graded as "text" (ASDiv `answer_is_number`)."""
    rows: int | None = None
    """Row count of the local file (the data README table)."""
    notes: str = ""
    """Where the Hub copy differs from the local file."""

    def kind_for_row(self, row: Mapping[str, Any]) -> str:
        """The answer kind of one row (ASDiv rows with `answer_is_number` false are "text")."""
        if self.text_kind_field is not None and row.get(self.text_kind_field) is False:
            return "text"
        return self.answer_kind


_PB_FIELDS = HubFields(question=("problem",), answer=None, answer_transform="none", id="id")


def _processbench(subset: str, rows: int) -> BenchmarkSpec:
    return BenchmarkSpec(
        name=f"processbench_{subset}",
        filename=f"processbench_{subset}.jsonl",
        answer_kind="none",
        hub_id="Qwen/ProcessBench",
        hub_config=None,
        hub_split=subset,
        hub_fields=_PB_FIELDS,
        rows=rows,
        notes="Hub copy may carry later annotation fixes than the local git snapshot.",
    )


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="gsm8k",
            filename="gsm8k_test.jsonl",
            answer_kind="number",
            hub_id="openai/gsm8k",
            hub_config="main",
            hub_split="test",
            hub_fields=HubFields(
                question=("question",), answer="answer", answer_transform="gsm8k", id_prefix="gsm8k-test-"
            ),
            rows=1319,
        ),
        BenchmarkSpec(
            name="math500",
            filename="math500_test.jsonl",
            answer_kind="latex",
            hub_id="HuggingFaceH4/MATH-500",
            hub_split="test",
            hub_fields=HubFields(question=("problem",), answer="answer", id="unique_id"),
            rows=500,
        ),
        BenchmarkSpec(
            name="svamp",
            filename="svamp.jsonl",
            answer_kind="number",
            hub_id="ChilleD/SVAMP",
            hub_split="test",
            hub_fields=HubFields(
                question=("Body", "Question"),
                answer="Answer",
                answer_transform="number",
                id="ID",
                id_prefix="svamp-",
            ),
            rows=1000,
            notes="ChilleD/SVAMP splits the 1,000 problems into train (700) and test (300).",
        ),
        BenchmarkSpec(
            name="addsub",
            filename="addsub.jsonl",
            answer_kind="number",
            hub_id="allenai/lila",
            hub_config="addsub",
            hub_split="test",
            hub_fields=HubFields(
                question=("input",),
                answer="output_answer",
                answer_transform="number",
                id_prefix="addsub-lila-test-",
            ),
            rows=395,
            notes="Lila splits AddSub's 395 problems into train/validation/test; ids differ.",
        ),
        BenchmarkSpec(
            name="asdiv",
            filename="asdiv.jsonl",
            answer_kind="number",
            hub_id="EleutherAI/asdiv",
            hub_split="validation",
            hub_fields=HubFields(
                question=("body", "question"), answer="answer", answer_transform="asdiv", id_prefix="asdiv-"
            ),
            text_kind_field="answer_is_number",
            rows=2305,
            notes="Hub rows carry no answer_is_number flag; non-numeric answers are then detected.",
        ),
        BenchmarkSpec(
            name="aqua",
            filename="aqua_test.jsonl",
            answer_kind="choice",
            hub_id="deepmind/aqua_rat",
            hub_config="raw",
            hub_split="test",
            hub_fields=HubFields(
                question=("question",),
                answer="correct",
                answer_transform="letter",
                id_prefix="aqua-test-",
                options="options",
            ),
            rows=254,
        ),
        BenchmarkSpec(
            name="gsm_ic_2step",
            filename="gsm_ic_2step_1k.jsonl",
            answer_kind="number",
            hub_id=None,
            rows=1000,
            notes="The 1K subset of GSM-IC (from wzy6642/PRP) has no Hub copy; use the local file.",
        ),
        BenchmarkSpec(
            name="gsm_ic_mstep",
            filename="gsm_ic_mstep_1k.jsonl",
            answer_kind="number",
            hub_id=None,
            rows=1000,
            notes="The 1K subset of GSM-IC (from wzy6642/PRP) has no Hub copy; use the local file.",
        ),
        _processbench("gsm8k", 400),
        _processbench("math", 1000),
        _processbench("olympiadbench", 1000),
        _processbench("omnimath", 1000),
    )
}
"""Every known benchmark by registry name."""

_BY_FILENAME = {spec.filename: spec for spec in BENCHMARKS.values()}


def spec_for_filename(path: str | os.PathLike[str]) -> BenchmarkSpec | None:
    """The registry entry whose file name is the name of `path`, if any."""
    return _BY_FILENAME.get(Path(path).name)


def default_data_dir() -> Path | None:
    """`$STEPRL_DATA_DIR` if set, else `<repo root>/../shared/data` if it exists, else None."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    repo_root = Path(__file__).resolve().parent.parent
    candidate = repo_root.parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


# ----------------------------------------------------------------------------------------------
# JSONL files


KindSpec = str | Callable[[Mapping[str, Any]], str] | None


def _row_kind(row: Mapping[str, Any], answer_kind: KindSpec, where: str) -> str:
    if callable(answer_kind):
        kind = answer_kind(row)
    elif answer_kind is not None:
        kind = answer_kind
    else:
        kind = row.get("answer_kind", "number")
    if kind not in ANSWER_KINDS:
        raise DatasetError(f"{where}: answer_kind must be one of {ANSWER_KINDS}, got {kind!r}")
    return kind


def _problem_from_row(row: dict[str, Any], answer_kind: KindSpec, where: str) -> Problem:
    for key in ("id", "question", "answer"):
        if key not in row:
            raise DatasetError(f"{where}: missing field {key!r}")
        if not isinstance(row[key], str):
            raise DatasetError(f"{where}: field {key!r} must be a string, got {type(row[key]).__name__}")
    kind = _row_kind(row, answer_kind, where)
    meta = {k: v for k, v in row.items() if k not in ("id", "question", "answer", "answer_kind")}
    options = None
    raw_options = meta.get("options")
    if isinstance(raw_options, list) and all(isinstance(o, str) for o in raw_options):
        options = meta.pop("options")
    elif kind == "choice" and raw_options is not None:
        raise DatasetError(f"{where}: field 'options' must be a list of strings")
    return Problem(
        id=row["id"],
        question=row["question"],
        answer=gold_answer(row["answer"]),
        answer_kind=kind,
        options=options,
        meta=meta,
    )



def _parse_jsonl_line(raw: bytes, lineno: int, path: Path) -> tuple[str, dict | None]:
    """("file:line", object) of one raw line, None for a blank one; DatasetError when it is bad."""
    where = f"{path}:{lineno}"
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{where}: not UTF-8 ({e.reason})") from None
    if not line.strip():
        return where, None
    try:
        row = json_loads(line)
    except JSONInputError as e:
        raise DatasetError(f"{where}: invalid JSON ({e})") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return where, row


def iter_jsonl_objects(path: str | os.PathLike[str]) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "file:line", object) for every non-blank line of a JSONL file of objects.

    Raises DatasetError naming the file and line for bytes that are not UTF-8, invalid JSON, or a
    value that is not an object.
    """
    path = Path(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where, row = _parse_jsonl_line(raw, lineno, path)
            if row is not None:
                yield lineno, where, row


def read_appended_jsonl(path: str | os.PathLike[str]) -> tuple[list[tuple[int, dict]], bool]:
    """The rows of a JSONL file a run appends to, for resuming it.

    Returns (line number, object) for every complete line, and whether a partial last line (text
    after the last newline: what a killed write leaves) was dropped. A bad complete line is
    corruption, not a kill: DatasetError names the file and line. A missing file has no rows.
    """
    path = Path(path)
    if not path.exists():
        return [], False
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    rows = []
    for lineno, raw in enumerate(data[:complete].split(b"\n")[:-1], start=1):
        row = _parse_jsonl_line(raw, lineno, path)[1]
        if row is not None:
            rows.append((lineno, row))
    return rows, complete < len(data)


def load_jsonl_problems(
    path: str | os.PathLike[str], answer_kind: KindSpec = None, limit: int | None = None
) -> list[Problem]:
    """Read problems from a JSONL file in the `../shared/data` schema.

    answer_kind: a kind for every row, a function of the row, or None to use each row's
    `answer_kind` field (default "number"). limit: stop after this many problems.
    Blank lines are skipped. A malformed row (bad JSON, not an object, missing or non-string
    id/question/answer, duplicate id) raises DatasetError naming the file and 1-based line.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path = Path(path)
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for lineno, where, row in iter_jsonl_objects(path):
        if limit is not None and len(problems) >= limit:
            break
        problem = _problem_from_row(row, answer_kind, where)
        if problem.id in first_line:
            raise DatasetError(
                f"{where}: duplicate id {problem.id!r} (first on line {first_line[problem.id]})"
            )
        first_line[problem.id] = lineno
        problems.append(problem)
    return problems


# ----------------------------------------------------------------------------------------------
# the Hub


def _hub_problem(spec: BenchmarkSpec, row: Mapping[str, Any], index: int) -> Problem:
    fields = spec.hub_fields
    assert fields is not None
    where = f"{spec.hub_id} split {spec.hub_split!r} row {index}"
    try:
        question = " ".join(str(row[f]).strip() for f in fields.question)
        raw_answer = row[fields.answer] if fields.answer is not None else None
        answer = ANSWER_TRANSFORMS[fields.answer_transform](raw_answer)
    except KeyError as e:
        raise DatasetError(f"{where}: missing field {e}") from None
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{where}: bad answer ({e})") from None
    if fields.id is not None and row.get(fields.id) is not None:
        pid = f"{fields.id_prefix}{row[fields.id]}"
    else:
        pid = f"{fields.id_prefix}{index}"
    # the fields that became question/answer/options are not repeated in meta; an id field other
    # than "id" stays (MATH-500's unique_id is also a meta field of the local file)
    used = set(fields.question) | {fields.answer, fields.options, "id"}
    meta = {k: v for k, v in row.items() if k not in used}
    kind = spec.answer_kind
    if spec.text_kind_field is not None:
        flag = row.get(spec.text_kind_field)
        if flag is None:  # not in the Hub row: a single number is numeric, anything else text
            flag = ";" not in answer and parse_number(answer) is not None
        meta[spec.text_kind_field] = bool(flag)
        kind = spec.kind_for_row(meta)
    options = None
    if fields.options is not None:
        options = [str(o) for o in row.get(fields.options) or []]
    return Problem(id=pid, question=question, answer=answer, answer_kind=kind, options=options, meta=meta)


def _load_from_hub(spec: BenchmarkSpec, limit: int | None) -> list[Problem]:
    if spec.hub_id is None or spec.hub_fields is None:
        raise FileNotFoundError(
            f"benchmark {spec.name!r} has no Hub copy; put {spec.filename} in the data directory "
            f"(${DATA_DIR_ENV} or ../shared/data). {spec.notes}".strip()
        )
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise ImportError("loading a benchmark from the Hub needs `datasets`: pip install datasets") from e
    split = spec.hub_split if limit is None else f"{spec.hub_split}[:{limit}]"
    if spec.hub_config is not None:
        rows: Iterable[Mapping[str, Any]] = datasets.load_dataset(spec.hub_id, spec.hub_config, split=split)
    else:
        rows = datasets.load_dataset(spec.hub_id, split=split)
    problems = []
    for index, row in enumerate(rows):
        if limit is not None and index >= limit:
            break
        problems.append(_hub_problem(spec, row, index))
    return problems


# ----------------------------------------------------------------------------------------------
# entry point


_SQUASHED = {name.replace("_", ""): name for name in BENCHMARKS}


def _registry_name(name: str) -> str:
    """The registry key of a name as users write it: "GSM8K", "MATH-500", "math_500" ..."""
    key = name.strip().lower().replace("-", "_")
    return key if key in BENCHMARKS else _SQUASHED.get(key.replace("_", ""), key)


def benchmark_spec(name: str) -> BenchmarkSpec:
    """The registry entry of a benchmark name (KeyError when it is none)."""
    return BENCHMARKS[_registry_name(name)]


def is_benchmark_name(name: str) -> bool:
    """Whether `load_benchmark(name)` reads a registry benchmark (not a file)."""
    return _registry_name(name) in BENCHMARKS


def load_benchmark(
    name_or_path: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    source: str = "auto",
) -> list[Problem]:
    """Load a benchmark by registry name (see BENCHMARKS) or from a `.jsonl` path.

    A name reads `<data_dir>/<filename>` (data_dir defaults to `default_data_dir()`). When there
    is no local file and `source` is "auto" or "hub", the public Hub copy is loaded with
    `datasets` (network); source="local" never goes to the Hub, source="hub" always does.
    A path reads the file; each row's `answer_kind` field, else the registry kind when the file
    name is a registry file name, else "number", says how it is graded.
    Unknown names raise ValueError listing the known names.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    text = os.fspath(name_or_path)
    key = _registry_name(text)
    if key in BENCHMARKS:
        spec = BENCHMARKS[key]
        if source != "hub":
            directory = Path(data_dir) if data_dir is not None else default_data_dir()
            if directory is not None and (directory / spec.filename).is_file():
                return load_jsonl_problems(directory / spec.filename, _spec_kind(spec), limit)
            if source == "local":
                where = (
                    directory if directory is not None else f"${DATA_DIR_ENV} / ../shared/data (not found)"
                )
                raise FileNotFoundError(f"benchmark {spec.name!r}: no {spec.filename} in {where}")
        return _load_from_hub(spec, limit)
    path = Path(text)
    if text.endswith(".jsonl") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"no such dataset file: {path}")
        file_spec = spec_for_filename(path)
        return load_jsonl_problems(path, _file_kind(file_spec), limit)
    known = ", ".join(sorted(BENCHMARKS))
    raise ValueError(f"unknown benchmark {text!r}; known benchmarks: {known} (or a path to a .jsonl file)")


def _spec_kind(spec: BenchmarkSpec) -> Callable[[Mapping[str, Any]], str]:
    def kind(row: Mapping[str, Any]) -> str:
        return spec.kind_for_row(row)

    return kind


def _file_kind(spec: BenchmarkSpec | None) -> Callable[[Mapping[str, Any]], str]:
    def kind(row: Mapping[str, Any]) -> str:
        if "answer_kind" in row:
            return row["answer_kind"]
        return spec.kind_for_row(row) if spec is not None else "number"

    return kind
