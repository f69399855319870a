"""The one problem loader: a set of problems from whatever a user names, with its split.

Training prompts (PPO, annotation) and evaluation sets (`inference.evaluate`, PPO's greedy
evaluation, checkpoint curves) all come through `load_problem_set`:

- `world` or `world:SPLIT`: the arithmetic world (`reasoning.world.generate`);
- a benchmark registry name (`gsm8k`, `math500`, ...; `reasoning.benchmarks.BENCHMARKS`): the
  local file of the data directory, else its Hub copy when online;
- a local file: `.jsonl`, `.json`, `.parquet`, `.csv`;
- a folder written by `datasets`' `save_to_disk` (a `Dataset`, or a `DatasetDict` whose split
  is picked with `FOLDER:SPLIT`);
- a Hub dataset id, `ID[:CONFIG]:SPLIT` (e.g. `openai/gsm8k:main:train`), when online.

Rows may follow any of the common schemas: question/answer (GSM8K, ours), problem/solution
(MATH), problem/answer (MATH-500), prompt/completion (TRL; a conversational prompt's last user
message is the question); `question_column` / `answer_column` name other columns. A GSM8K
solution ("... #### 42") and a MATH solution ("... \\boxed{42}") are reduced to the gold answer,
whichever way the rows came. Rows without an id get `<name>-<row index>`.

Every set carries its split ("train", "test", "validation", "dev" or None when it cannot be
told): `check_training_split` refuses a test split as training prompts, `check_disjoint` refuses
a training set and an evaluation set that share questions.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from reasoning.answers import find_boxed, parse_number
from reasoning.benchmarks import (
    BENCHMARKS,
    DatasetError,
    benchmark_spec,
    default_data_dir,
    gold_answer,
    is_benchmark_name,
    iter_jsonl_objects,
    load_benchmark,
    spec_for_filename,
)
from reasoning.types import ANSWER_KINDS, Problem

__all__ = [
    "ProblemSet",
    "WorldDraw",
    "load_problem_set",
    "gold_answer",
    "question_key",
    "check_training_split",
    "check_disjoint",
    "hold_apart",
    "held_apart_count",
]

QUESTION_COLUMNS = ("question", "problem", "prompt")
"""Question columns recognised, in this order, when `question_column` is not given."""
ANSWER_COLUMNS = ("answer", "solution", "completion")
"""Answer columns recognised, in this order (a row with both keeps `answer`: MATH-500)."""
ID_COLUMNS = ("id", "unique_id")
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix -> `datasets` builder."""
TEST_SPLIT = "test"
_SPLIT_WORDS = {"test": "test", "train": "train", "training": "train", "validation": "validation",
                "valid": "validation", "val": "validation", "dev": "dev"}

DESCRIPTION = ("'world', a benchmark name, a .jsonl/.json/.parquet/.csv file, a save_to_disk folder "
               "or a Hub id (ID[:CONFIG]:SPLIT)")
"""What a dataset flag takes, for help texts and errors."""


@dataclass
class WorldDraw:
    """How `world` is drawn for one use: the split when the name gives none, seed, count, world."""

    split: str
    n: int
    seed: int = 0
    config: Any = None
    """A `reasoning.world.WorldConfig`; None: the default world."""


@dataclass
class ProblemSet:
    """Problems loaded from one source, the split they are, and world rows for the exact verifier."""

    name: str
    """What the user named (a flag's value)."""
    problems: list[Problem]
    split: str | None
    """"train", "test", "validation", "dev", or None when the source does not tell."""
    world_rows: list[dict] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# answers and questions


def _answer_is_solution(value: Any) -> str | None:
    """"number" for a GSM8K solution, "latex" for a boxed one, None for a bare answer."""
    if not isinstance(value, str):
        return None
    if "####" in value:
        return "number"
    return "latex" if find_boxed(value) is not None else None


def question_key(question: str) -> str:
    """A hash of the question with case and whitespace normalised: the same problem, however spaced."""
    return hashlib.sha1(" ".join(question.lower().split()).encode("utf-8")).hexdigest()


def _message_text(value: Any, role: str) -> Any:
    """The text of a conversational field (a list of {role, content}): its last `role` message."""
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        texts = [m.get("content") for m in value if m.get("role") == role]
        return texts[-1] if texts else value[-1].get("content")
    return value


# ----------------------------------------------------------------------------------------------
# rows -> problems


KindOf = str | Callable[[Mapping[str, Any]], str] | None
"""The answer kind of rows without an `answer_kind` field: one for all, a function of the row, or
None (told from the answer: a number, else LaTeX)."""


@dataclass
class _Columns:
    question: str
    answer: str
    id: str | None


def _pick_columns(columns: Sequence[str], question_column: str | None, answer_column: str | None,
                  where: str) -> _Columns:
    present = list(columns)

    def pick(given: str | None, candidates: tuple[str, ...], flag: str) -> str | None:
        if given is not None:
            if given not in present:
                raise DatasetError(f"{where}: no column {given!r} ({flag}); columns: {', '.join(present)}")
            return given
        return next((c for c in candidates if c in present), None)

    question = pick(question_column, QUESTION_COLUMNS, "--question_column")
    if question is None:
        raise DatasetError(f"{where}: no question column (looked for {', '.join(QUESTION_COLUMNS)}); columns: "
                           f"{', '.join(present)}; name it with --question_column")
    answer = pick(answer_column, ANSWER_COLUMNS, "--answer_column")
    if answer is None:
        raise DatasetError(f"{where}: no answer column (looked for {', '.join(ANSWER_COLUMNS)}); columns: "
                           f"{', '.join(present)}; name it with --answer_column")
    return _Columns(question, answer, next((c for c in ID_COLUMNS if c in present), None))


def _row_problem(row: Mapping[str, Any], cols: _Columns, index: int, id_prefix: str, default_kind: KindOf,
                 where: str) -> Problem:
    for column in (cols.question, cols.answer):
        if row.get(column) is None:
            raise DatasetError(f"{where}: missing field {column!r}")
    question = _message_text(row.get(cols.question), "user")
    if not isinstance(question, str):
        raise DatasetError(f"{where}: field {cols.question!r} must be a string, got {type(question).__name__}")
    raw_answer = _message_text(row.get(cols.answer), "assistant")
    try:
        answer = gold_answer(raw_answer)
    except ValueError as e:
        raise DatasetError(f"{where}: field {cols.answer!r}: {e}") from None
    raw_id = row.get(cols.id) if cols.id is not None else None
    pid = f"{id_prefix}{index}" if raw_id is None or raw_id == "" else str(raw_id)
    kind = row.get("answer_kind")
    if kind is None:
        kind = (default_kind(row) if callable(default_kind) else default_kind) or _answer_is_solution(raw_answer)
    if kind is None:
        kind = "none" if not answer else ("number" if parse_number(answer) is not None else "latex")
    if kind not in ANSWER_KINDS:
        raise DatasetError(f"{where}: answer_kind must be one of {ANSWER_KINDS}, got {kind!r}")
    used = {cols.question, cols.answer, cols.id, "answer_kind"}
    meta = {k: v for k, v in row.items() if k not in used}
    options = None
    raw_options = meta.get("options")
    if isinstance(raw_options, list) and all(isinstance(o, str) for o in raw_options):
        options = meta.pop("options")
    return Problem(id=pid, question=question, answer=answer, answer_kind=kind, options=options, meta=meta)


def _problems_from_rows(rows: Iterable[tuple[str, Mapping[str, Any]]], columns: Sequence[str] | None,
                        question_column: str | None, answer_column: str | None, id_prefix: str,
                        default_kind: KindOf, limit: int | None, origin: str) -> list[Problem]:
    """Problems of (where, row) pairs; `columns` None: each row's own keys name the columns."""
    problems: list[Problem] = []
    first: dict[str, str] = {}
    cols = None if columns is None else _pick_columns(columns, question_column, answer_column, origin)
    for index, (where, row) in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        row_cols = cols or _pick_columns(list(row), question_column, answer_column, where)
        problem = _row_problem(row, row_cols, index, id_prefix, default_kind, where)
        if problem.id in first:
            raise DatasetError(f"{where}: duplicate id {problem.id!r} (first at {first[problem.id]})")
        first[problem.id] = where
        problems.append(problem)
    return problems


# ----------------------------------------------------------------------------------------------
# splits


def split_of_name(text: str) -> str | None:
    """The split a file or folder name says: `gsm8k_test.jsonl`, `test-00000-of-00001.parquet`,
    `train.csv`; None when no word of the name is a split's (the folders above it are not read:
    `tests/...` or pytest's `test_x0/` say nothing of the rows)."""
    words = [w for w in re.split(r"[^a-z]+", Path(text).name.lower()) if w]
    found = [_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS]
    return found[-1] if found else None


def check_training_split(problem_set: ProblemSet, flag: str, allow_test_split: bool) -> None:
    """DatasetError when a test split is to be trained on and the user has not said so."""
    if problem_set.split == TEST_SPLIT and not allow_test_split:
        raise DatasetError(f"{flag} {problem_set.name}: is a test split, not training data; train on a "
                           "train split (e.g. a GSM8K train file, or ID:train) or pass --allow_test_split")


def check_disjoint(train: ProblemSet, evaluation: ProblemSet, train_flag: str = "--dataset",
                   eval_flag: str = "--eval_dataset") -> None:
    """DatasetError when the training and evaluation sets share questions (case and spacing aside)."""
    train_keys = {question_key(p.question) for p in train.problems}
    shared = sum(question_key(p.question) in train_keys for p in evaluation.problems)
    if shared:
        raise DatasetError(f"{train_flag} {train.name} and {eval_flag} {evaluation.name} share {shared} of "
                           f"{len(evaluation.problems)} evaluation questions: evaluate on problems the run does "
                           "not train on")


HOLD_APART_SHARE = 10
"""`hold_apart` keeps one row in this many (the last ones) for evaluation."""


def held_apart_count(n_rows: int, n_eval: int) -> int:
    """How many of `n_rows` rows `hold_apart` keeps for evaluation: the last tenth, at least one and at
    most `n_eval`; none from a set of fewer than two rows (the one row is needed for training)."""
    if n_rows < 2 or n_eval < 1:
        return 0
    return min(n_eval, max(1, n_rows // HOLD_APART_SHARE))


def hold_apart(whole: ProblemSet, n_eval: int, n_train: int) -> tuple[ProblemSet, ProblemSet]:
    """A user's own rows split into training prompts and evaluation problems held apart from them:
    the last `held_apart_count` rows are evaluated, the first `n_train` of the rest (less any whose
    question a held-apart row repeats) are trained on, so the two share no question."""
    held = held_apart_count(len(whole.problems), n_eval)
    cut = len(whole.problems) - held
    evaluation = whole.problems[cut:]
    keys = {question_key(p.question) for p in evaluation}
    train = [p for p in whole.problems[:cut] if question_key(p.question) not in keys][:n_train]
    name = f"{whole.name} (its last {held} rows, held apart)"
    return (ProblemSet(whole.name, train, whole.split),
            ProblemSet(name, evaluation, whole.split))


# ----------------------------------------------------------------------------------------------
# sources


def _load_world(name: str, world: WorldDraw | None, limit: int | None) -> ProblemSet:
    from reasoning.world import generate, row_to_problem

    draw = world or WorldDraw(split="test", n=500)
    split = name.split(":", 1)[1] if ":" in name else draw.split
    try:
        rows = generate(split, draw.n, draw.seed, draw.config)
    except ValueError as e:
        raise DatasetError(f"{name}: {e}") from None
    rows = rows if limit is None else rows[:limit]
    return ProblemSet(name, [row_to_problem(r) for r in rows], split, rows)


def _load_jsonl(path: Path, question_column: str | None, answer_column: str | None,
                limit: int | None) -> list[Problem]:
    spec = spec_for_filename(path)  # a registry file name: the benchmark's answer kinds
    rows = ((where, row) for _, where, row in iter_jsonl_objects(path))
    return _problems_from_rows(rows, None, question_column, answer_column, f"{path.stem}-",
                               spec.kind_for_row if spec is not None else None, limit, str(path))


def _datasets() -> ModuleType:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise DatasetError("reading this dataset needs `datasets`: pip install datasets") from e
    datasets.disable_progress_bars()
    return datasets


def _from_dataset(dataset: Any, name: str, question_column: str | None, answer_column: str | None,
                  limit: int | None, id_prefix: str) -> list[Problem]:
    """`dataset`: a `datasets.Dataset` (rows and `column_names`)."""
    rows = ((f"{name} row {i}", row) for i, row in enumerate(dataset))
    return _problems_from_rows(rows, dataset.column_names, question_column, answer_column, id_prefix, None,
                               limit, name)


def _load_file(path: Path, question_column: str | None, answer_column: str | None,
               limit: int | None) -> list[Problem]:
    builder = FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        raise DatasetError(f"{path}: unknown file type {path.suffix!r}; use one of {', '.join(FILE_FORMATS)}")
    if path.suffix.lower() == ".jsonl":
        return _load_jsonl(path, question_column, answer_column, limit)
    datasets = _datasets()
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as e:  # datasets raises many kinds for an unreadable file
        raise DatasetError(f"{path}: cannot be read as {path.suffix[1:]} ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    return _from_dataset(dataset, str(path), question_column, answer_column, limit, f"{path.stem}-")


def _load_disk(path: Path, split: str | None, default_split: str, question_column: str | None,
               answer_column: str | None, limit: int | None) -> tuple[list[Problem], str | None]:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DatasetError(f"{path}: not a folder written by save_to_disk ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    if isinstance(loaded, datasets.DatasetDict):
        chosen = split or default_split
        if chosen not in loaded:
            raise DatasetError(f"{path}: no split {chosen!r}; splits: {', '.join(loaded)} (name one as {path}:SPLIT)")
        return (_from_dataset(loaded[chosen], f"{path}:{chosen}", question_column, answer_column, limit,
                              f"{path.name}-{chosen}-"), chosen)
    return (_from_dataset(loaded, str(path), question_column, answer_column, limit, f"{path.name}-"),
            split or split_of_name(str(path)))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on") or \
        os.environ.get("HF_DATASETS_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _load_hub(text: str, default_split: str, question_column: str | None, answer_column: str | None,
              limit: int | None) -> tuple[list[Problem], str]:
    parts = text.split(":")
    hub_id, config, split = parts[0], None, default_split
    if len(parts) == 2:
        split = parts[1]
    elif len(parts) == 3:
        config, split = parts[1], parts[2]
    elif len(parts) > 3:
        raise DatasetError(f"{text}: a Hub dataset is ID[:CONFIG]:SPLIT")
    datasets = _datasets()
    try:
        dataset = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:
        if _hub_offline():
            raise DatasetError(f"{text}: not a local file or folder, and the Hub is offline (HF_HUB_OFFLINE) with "
                               "no cached copy; download it first or name a local file") from None
        raise DatasetError(f"{text}: cannot load from the Hub ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    id_prefix = f"{hub_id.split('/')[-1]}-{split}-"
    return _from_dataset(dataset, text, question_column, answer_column, limit, id_prefix), split


def _load_registry(text: str, data_dir: str | os.PathLike[str] | None, source: str,
                   limit: int | None) -> ProblemSet:
    try:
        problems = load_benchmark(text, data_dir=data_dir, limit=limit, source=source)
    except (DatasetError, FileNotFoundError):
        raise
    except Exception as e:  # the Hub copy: offline (ConnectionError), missing, ...
        spec = benchmark_spec(text)
        where = data_dir or default_data_dir() or "../shared/data ($STEPRL_DATA_DIR)"
        raise DatasetError(f"benchmark {spec.name!r}: no {spec.filename} in {where}, and its Hub copy "
                           f"{spec.hub_id} could not be loaded ({type(e).__name__}); put the file there or go "
                           "online") from None
    # the registry's local files are the benchmarks' evaluation sets (../shared/data/README.md)
    return ProblemSet(text, problems, TEST_SPLIT)


def is_world_name(name: str | os.PathLike[str] | None) -> bool:
    """Whether a dataset name means the arithmetic world (`world` or `world:SPLIT`), whose problems
    are drawn in the policy's world: only then is the policy's `world_config.json` read."""
    text = "" if name is None else os.fspath(name)
    return text == "world" or text.startswith("world:")


def load_problem_set(
    name: str,
    *,
    role: str = "eval",
    limit: int | None = None,
    world: WorldDraw | None = None,
    question_column: str | None = None,
    answer_column: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    source: str = "auto",
) -> ProblemSet:
    """The problems `name` names (see the module docstring), the first `limit` of them.

    role: "train" or "eval": the split taken from a `DatasetDict` folder or a Hub id whose name
    gives none. Raises DatasetError (one line naming the source, the row or the column) for
    anything that cannot be read.
    """
    if role not in ("train", "eval"):
        raise ValueError(f"role must be 'train' or 'eval', got {role!r}")
    if limit is not None and limit < 0:
        raise DatasetError(f"{name}: limit must be >= 0, got {limit}")
    text = os.fspath(name)
    if is_world_name(text):
        return _load_world(text, world, limit)
    if is_benchmark_name(text):
        return _load_registry(text, data_dir, source, limit)
    default_split = "train" if role == "train" else TEST_SPLIT
    path = Path(text)
    if path.is_file():
        return ProblemSet(text, _load_file(path, question_column, answer_column, limit),
                          split_of_name(text) or _split_of_registry_file(path))
    if path.suffix.lower() in FILE_FORMATS:
        raise DatasetError(f"{text}: no such file")
    folder, _, split = text.rpartition(":") if ":" in text and not path.is_dir() else (text, "", "")
    if Path(folder).is_dir():
        problems, found = _load_disk(Path(folder), split or None, default_split, question_column,
                                     answer_column, limit)
        return ProblemSet(text, problems, found)
    if "/" in text.split(":")[0] and not text.startswith((".", "/")):
        problems, split = _load_hub(text, default_split, question_column, answer_column, limit)
        return ProblemSet(text, problems, _SPLIT_WORDS.get(split.split("[")[0].lower(), split))
    raise DatasetError(f"{text!r}: no such file or folder, and not a benchmark ({', '.join(sorted(BENCHMARKS))}); "
                       f"a dataset is {DESCRIPTION}")


def _split_of_registry_file(path: Path) -> str | None:
    return TEST_SPLIT if spec_for_filename(path) is not None else None


def check_source(name: str, flag: str) -> None:
    """DatasetError (cheap: nothing read) when `name` cannot be a dataset at all."""
    if name in ("world", "none") or name.startswith("world:") or is_benchmark_name(name):
        return
    path = Path(name)
    if path.is_file():
        if path.suffix.lower() not in FILE_FORMATS:
            raise DatasetError(f"{flag} {name}: unknown file type {path.suffix!r}; use one of "
                               f"{', '.join(FILE_FORMATS)}")
        return
    if path.suffix.lower() in FILE_FORMATS:
        raise DatasetError(f"{flag} {name}: no such file")
    folder = name.rpartition(":")[0] if ":" in name and not path.is_dir() else name
    if Path(folder).is_dir():
        return
    if "/" in name.split(":")[0] and not name.startswith((".", "/")):
        return  # a Hub id: checked when loaded
    raise DatasetError(f"{flag} {name!r}: not {DESCRIPTION}; benchmarks: {', '.join(sorted(BENCHMARKS))}")
