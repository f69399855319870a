"""The evaluation harness: one inference method on one dataset, graded, resumable.

    python -m inference.evaluate --method M --dataset D --policy P --out DIR
        [--verifier V] [--backend hf|vllm|openai] [--limit N] [--batch_size B]
        [--chunk_size C] [--config recipe.yaml] [--overwrite] [--quiet] [method options]

`M` names a module of `inference/methods/` (greedy, self_consistency, best_of_n, stepco, pathco,
beats) or any importable module (a dotted path) with a `Config` dataclass and
`run(problems, tracker, config)`. Every field of the method's `Config` is a flag
(`--threshold 0.5 --max_rounds 5 --n 8 --aggregation mean ...`); `--method M --help` lists them with
their docstrings. A field whose name is also a harness flag (e.g. `batch_size`) is
`--method_<name>`. StepCo's `--revision` and `--threshold` default to `auto`, chosen before the run
by `inference.chosen_settings` (the revise prompt only for a policy taught it; θ calibrated on the
world's dev split and kept only if StepCo beats its first paths there) and recorded as `chosen`.

`D` is `world` (the world's test split as `rl.sft` builds it: `--n_world` problems with
`--world_seed`, in the world the policy was trained on; `world:dev` for another split), a benchmark
name of `reasoning.benchmarks` (gsm8k, math500, svamp, addsub, asdiv, aqua, gsm_ic_2step, ...,
read from `--data_dir`, default `../shared/data`) or a `.jsonl` file in that schema.

`P` is the policy: a `save_pretrained` directory for `hf`, a local directory or Hub id for `vllm`,
the served model name for `openai` (any OpenAI-compatible server, e.g. `python -m
backends.serve`). Backends are built by `backends.factory.make_generator`;
`--batch_size` and `--device` apply to `hf`, and `--backend_options '{"base_url": ...}'` passes
anything else a backend takes. Models are loaded on first use, so re-running a finished run
loads none.
`V` is a verifier spec of `reward_models.load.load_verifier` (a PSV directory, `confidence`,
`exact`, `math-shepherd:PATH`, `token-prm:PATH`); `exact` reads the world's quantities and is
labelled in the summary as an upper reference (`"verifier_is_reference": true`), never a method.

**Blind, then grade.** The method sees `inference.methods.base.blind(problems)`: no gold answer,
no gold steps, no world quantities. Grading happens here, afterwards, by
`reasoning.steps.answer_correct` on the method's prediction, under both answer checks: `correct`
(the headline `accuracy`) is "flexible", the prediction as the method extracted it (the last number
when no answer is stated); `correct_strict` (`accuracy_strict`) is "strict", which also asks the
completion to state its answer (`<ans>`, "answer is", `\\boxed`), the check that training uses by
default (PPO's `--answer_match`, annotation's labels).

**Outputs.** `DIR/results.jsonl`, one row per problem: `id`, `question`, `answer` (gold),
`answer_kind`, `prediction`, `correct`, `correct_strict`, `completion`, `usage` (prompt / completion / verifier
tokens, LLM and verifier calls), `flags`, `trace`, `chunk`, and on world problems `error_kind`
(the world checker's earliest error of the completion, None when it has none).
`DIR/summary.json`, recomputed from all rows at the end: accuracy with a 95% bootstrap interval
under each answer check (`accuracy`, `accuracy_ci95`: flexible; `accuracy_strict`,
`accuracy_strict_ci95`: strict),
token and call totals, wall seconds, flag counts, the full method config, dataset, policy,
verifier, backend and seed. The summary is also printed as one JSON line.

**Context.** With a backend that states its context (`hf`: the model config's
`max_position_embeddings`), a prompt that cannot fit with `max_new_tokens` new tokens is never
run: its row is flagged `prompt_too_long` (no prediction, counted in the summary's
`prompt_too_long`), and a `max_new_tokens` beyond the context is capped to it (a warning says
so). `vllm` and `openai` leave the check to the server.

**Resuming.** Problems are run in chunks of `--chunk_size`; chunk `c` always holds the same
problems and runs with a seed derived from (seed, c), so an interrupted and resumed run gives
the same rows as an uninterrupted one. After a chunk its rows are appended to `results.jsonl` and
fsynced, then the chunk's time goes to `DIR/progress.jsonl`. A re-run with the same `--out` keeps
the complete rows (a partial last line, left by a kill, is dropped and reported), re-runs only
chunks with missing problems and writes only the missing rows. `DIR/run_config.json` holds what
determines the results (method, its options, dataset and a fingerprint of its problems, policy,
verifier, backend, batch and chunk sizes, seed); resuming with a different one is refused
(`--overwrite` starts afresh).

Python API, for scripts such as `scripts/compare.py`:

    summary = evaluate("greedy", problems, generator, verifier=None, config=None, out_dir="runs/greedy")
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import random
import sys
import textwrap
import time
import types
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.methods import METHODS
from inference.methods.base import MethodOutput, NoVerifierError, Tracker, blind
from reasoning.benchmarks import DatasetError
from reasoning.jsonl import atomic_write, read_resumable_jsonl
from reasoning.questions import QuestionError, check_questions
from reasoning.stats import accuracy_interval
from reasoning.steps import answer_correct, has_answer
from reasoning.types import Problem
from reward_models.load import kinds_help

__all__ = [
    "BACKENDS",
    "EvalArguments",
    "EvaluationError",
    "build_generator",
    "chunk_seed",
    "evaluate",
    "load_method",
    "load_problems",
    "main",
    "parse_args",
    "read_results",
    "run_from_args",
    "summarize",
]

BACKENDS = ("hf", "vllm", "openai")
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
RUN_CONFIG = "run_config.json"
PROGRESS = "progress.jsonl"


class EvaluationError(ValueError):
    """Settings, inputs or an output directory the harness cannot work with; the message says which."""


# ----------------------------------------------------------------------------------------------
# settings


@dataclass
class EvalArguments:
    """Settings of the harness itself (the method's own options come from its `Config`)."""

    _argument_group_name = "evaluation"

    method: str = field(metadata={"help": f"Inference method: one of {', '.join(METHODS)}, or a dotted module path."})
    dataset: str = field(metadata={"help": "'world' (test split; 'world:dev' etc.), a benchmark name, a "
                                           ".jsonl/.json/.parquet/.csv file, a save_to_disk folder (FOLDER[:SPLIT], "
                                           "default test) or a Hub id (ID[:CONFIG]:SPLIT)."})
    policy: str = field(
        metadata={"help": "The policy: a save_pretrained directory (hf) or a model name (vllm, openai)."})
    out: str = field(metadata={"help": "Output directory (results.jsonl, summary.json); an existing run resumes."})
    verifier: str | None = field(
        default=None,
        metadata={"help": "Verifier spec (reward_models.load; a bare confidence kind reads the policy's own "
                          f"probabilities, exact is world only, an upper reference): {kinds_help()}."},
    )
    backend: str = field(default="hf", metadata={"help": "Generator backend.", "choices": list(BACKENDS)})
    backend_options: str | None = field(
        default=None, metadata={"help": "JSON object of extra backend options (e.g. base_url for openai)."}
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N problems."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per generation batch of the backend."})
    verifier_batch_size: int = field(default=32, metadata={"help": "Paths per verifier forward pass."})
    device: str | None = field(default=None, metadata={"help": "Device of local models (default: cuda if available)."})
    chat_template: bool = field(
        default=True, metadata={"help": "hf: prompt through the tokenizer's chat template when it has one "
                                        "(--no_chat_template: the plain prompt)."}
    )
    chunk_size: int = field(default=50, metadata={"help": "Problems per chunk: one method call, then rows are saved."})
    question_column: str | None = field(
        default=None, metadata={"help": "Column of the question (default: the first of question, problem, prompt)."}
    )
    answer_column: str | None = field(
        default=None, metadata={"help": "Column of the gold answer (default: the first of answer, solution, "
                                        "completion; a '#### N' or '\\boxed{}' solution is reduced to its answer)."}
    )
    n_world: int = field(default=500, metadata={"help": "World problems generated for --dataset world."})
    world_seed: int = field(default=0, metadata={"help": "Seed of the world problems."})
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder of benchmark files (default $STEPRL_DATA_DIR or ../shared/data)."}
    )
    source: str = field(
        default="auto", metadata={"help": "Benchmark source: local file, the Hub, or auto.",
                                  "choices": ["auto", "local", "hub"]}
    )
    bootstrap_samples: int = field(default=1000,
                                   metadata={"help": "Resamples of the accuracy's 95%% bootstrap interval."})
    overwrite: bool = field(default=False, metadata={"help": "Delete an existing run in --out and start afresh."})
    quiet: bool = field(default=False, metadata={"help": "No progress bar."})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise EvaluationError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("batch_size", "verifier_batch_size", "chunk_size", "bootstrap_samples"):
            if getattr(self, name) < 1:
                raise EvaluationError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 0:
            raise EvaluationError(f"--limit must be >= 0, got {self.limit}")
        if self.n_world < 0:
            raise EvaluationError(f"--n_world must be >= 0, got {self.n_world}")
        out = Path(self.out)
        existing = next((p for p in (out, *out.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise EvaluationError(f"--out {self.out}: {existing} is a file, not a directory")
        self.backend_kwargs()

    def backend_kwargs(self) -> dict[str, Any]:
        if not self.backend_options:
            return {}
        try:
            value = json.loads(self.backend_options)
        except json.JSONDecodeError as e:
            raise EvaluationError(f"--backend_options is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise EvaluationError("--backend_options must be a JSON object")
        return value


# ----------------------------------------------------------------------------------------------
# methods


def load_method(name: str | types.ModuleType) -> types.ModuleType:
    """The method module named `name` (a name of `inference/methods/` or a dotted module path)."""
    if isinstance(name, types.ModuleType):
        module = name
    else:
        full = name if "." in name else f"inference.methods.{name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name not in (full, full.rsplit(".", 1)[0]):
                raise  # the method exists but one of its imports is missing
            raise EvaluationError(
                f"unknown method {name!r}: no module {full}; methods: {', '.join(METHODS)} or a dotted module path"
            ) from None
    config_cls = getattr(module, "Config", None)
    if not (dataclasses.is_dataclass(config_cls) and isinstance(config_cls, type)) or not callable(
        getattr(module, "run", None)
    ):
        raise EvaluationError(f"method module {module.__name__} needs a `Config` dataclass and a `run` function")
    return module


def method_name(module: types.ModuleType) -> str:
    prefix = "inference.methods."
    return module.__name__[len(prefix):] if module.__name__.startswith(prefix) else module.__name__


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed chunk `chunk` runs with: fixed by (seed, chunk), independent of what ran before."""
    digest = hashlib.sha256(f"steprl-eval:{seed}:{chunk}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# ----------------------------------------------------------------------------------------------
# command-line flags from dataclass fields


def field_docs(cls: type) -> dict[str, str]:
    """Each field's attribute docstring (the string literal right after it) over the class's MRO."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        if not tree.body or not isinstance(tree.body[0], ast.ClassDef):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def method_flags(module: types.ModuleType) -> type:
    """The method's `Config` as a dataclass of command-line flags for `TrlParser`: the same fields,
    types and defaults, each field's docstring as its help; a field whose name is also a harness
    flag (or `config`) becomes `method_<name>`. `config_name` maps a flag back to its field."""
    taken = {f.name for f in dataclasses.fields(EvalArguments)} | {"config"}
    hints = typing.get_type_hints(module.Config)
    docs = field_docs(module.Config)
    specs, names, auto = [], {}, set()
    for f in dataclasses.fields(module.Config):
        if not f.init:
            continue
        kwargs: dict[str, Any] = {"metadata": {"help": docs.get(f.name, "").replace("%", "%%")}}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        name = f"method_{f.name}" if f.name in taken else f.name
        names[name] = f.name
        hint = hints[f.name]
        if f.metadata.get("auto"):  # a number or 'auto' (None in the Config: chosen by the harness)
            hint, kwargs["default"] = str, "auto" if f.default is None else str(f.default)
            auto.add(name)
        specs.append((name, hint, field(**kwargs)))
    flags = dataclasses.make_dataclass(f"{module.Config.__name__}Flags", specs)
    flags._argument_group_name = f"method options ({method_name(module)})"
    flags.config_name = names
    flags.auto_flags = auto
    return flags


def _auto_number(flag: str, value: Any) -> float | None:
    """A flag that takes a number or 'auto' (None: left to `inference.chosen_settings`)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise EvaluationError(f"--{flag} must be a number or auto, got {value!r}") from None


def _parser(flag_types: tuple[type, ...], module: types.ModuleType | None):
    from trl import TrlParser

    parser = TrlParser(
        flag_types,
        prog="python -m inference.evaluate",
        description="Run an inference method on a dataset, grade it, and write results.jsonl and summary.json.",
        epilog=None if module is not None else "Pass --method M with --help to list the method's options.",
    )
    parser.add_argument("--config", default=argparse.SUPPRESS,
                        help="YAML recipe: harness and method options (method_options: a mapping of the "
                             "method's); the flags win.")
    return parser


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise EvaluationError(f"--config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise EvaluationError(f"--config {path}: not YAML ({e})") from None
    if not isinstance(values, dict):
        raise EvaluationError(f"--config {path}: expected a mapping of option names to values")
    return values


def _check_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """An EvaluationError naming the first flag the parser does not take, with the closest one it does
    (`reasoning.flag_names`), instead of argparse's whole usage. A unique prefix of a flag is taken,
    as argparse takes it."""
    from reasoning.flag_names import did_you_mean

    known = [s for s in parser._option_string_actions if s.startswith("--")]
    for token in argv:
        if token == "--" or not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        if name in known or len([k for k in known if k.startswith(name)]) == 1:
            continue
        raise EvaluationError(f"unknown flag {name}{did_you_mean(name, [k[2:] for k in known])}")


def _set_recipe_defaults(parser, recipe: dict, flags, module: types.ModuleType, where: str) -> None:
    """The recipe's values (its `method_options` under their flag names) as the parser's defaults;
    EvaluationError naming an option the method or the harness does not have."""
    from reasoning.flag_names import did_you_mean

    defaults = dict(recipe)
    options = defaults.pop("method_options", {})
    if not isinstance(options, dict):
        raise EvaluationError(f"{where}: method_options must be a mapping")
    by_field = {v: k for k, v in flags.config_name.items()}
    for k, v in options.items():
        if k not in by_field:
            raise EvaluationError(f"{where}: method {method_name(module)} has no option {k!r}"
                                  + did_you_mean(str(k), list(by_field), prefix=""))
        defaults[by_field[k]] = v
    unknown = parser.set_defaults_with_config(**defaults)
    if unknown:
        name = unknown[0].lstrip("-")
        known = [s[2:] for s in parser._option_string_actions if s.startswith("--")]
        raise EvaluationError(f"{where}: unknown option {name!r}" + did_you_mean(name, known, prefix=""))


def parse_args(argv: Sequence[str] | None = None) -> tuple[EvalArguments, types.ModuleType, Any]:
    """(harness arguments, method module, method Config) from the command line and `--config`.

    The flags are those `TrlParser` makes of `EvalArguments` and of the method's `Config`
    (`method_flags`); the recipe's values become the parser's defaults, so the flags win. Raises
    SystemExit(2) with argparse's message for a bad flag or value, EvaluationError for a bad recipe
    or a value the dataclasses reject.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    pre.add_argument("--method", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.config is not None:  # the recipe is read here; the parser sees the rest of the line
        i = max(i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config="))
        del argv[i: i + (1 if "=" in argv[i] else 2)]
    recipe = _read_yaml(known.config) if known.config else {}
    method_spec = known.method or recipe.get("method")
    if method_spec is None:
        parser = _parser((EvalArguments,), None)
        _check_flags(parser, argv)
        parser.parse_args(argv)  # --help, or the message for missing --method
        parser.error("the following arguments are required: --method")
    module = load_method(method_spec)
    flags = method_flags(module)
    parser = _parser((EvalArguments, flags), module)
    _check_flags(parser, argv)
    _set_recipe_defaults(parser, recipe, flags, module, f"--config {known.config}")
    try:
        args, parsed, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True,
                                                                look_for_args_file=False)
    except EvaluationError:
        raise
    except (TypeError, ValueError) as e:
        raise EvaluationError(str(e)) from None
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    values = {flags.config_name[k]: _auto_number(k, v) if k in flags.auto_flags else v
              for k, v in dataclasses.asdict(parsed).items()}
    try:
        config = module.Config(**values)
    except (TypeError, ValueError) as e:
        raise EvaluationError(f"method {method_name(module)}: {e}") from None
    return args, module, config


# ----------------------------------------------------------------------------------------------
# data, generator, verifier


def load_problems(args: EvalArguments) -> tuple[list[Problem], list[dict]]:
    """The problems of `--dataset` (first `--limit`), and world rows for the `exact` verifier."""
    from reasoning.problem_sets import WorldDraw, is_world_name, load_problem_set
    from reasoning.world import world_config_of

    policy = args.policy if args.policy and Path(args.policy).is_dir() else None
    world = WorldDraw(split="test", n=args.n_world, seed=args.world_seed,
                      config=world_config_of(policy) if is_world_name(args.dataset) else None)
    loaded = load_problem_set(args.dataset, role="eval", limit=args.limit, world=world, data_dir=args.data_dir,
                              source=args.source, question_column=args.question_column,
                              answer_column=args.answer_column)
    return loaded.problems, loaded.world_rows or world_rows_of(loaded.problems)


def world_rows_of(problems: Sequence[Problem]) -> list[dict]:
    """World rows (with the `world` field) rebuilt from problems, e.g. those of a world JSONL file."""
    return [{"id": p.id, "question": p.question, "answer": p.answer, **p.meta} for p in problems if "world" in p.meta]


class _Lazy:
    """A generator or verifier loaded on first use, so that a finished run loads no model."""

    def __init__(self, load: Callable[[], Any], what: str):
        self._load, self._what, self._obj, self.load_seconds = load, what, None, 0.0

    def _get(self) -> Any:
        if self._obj is None:
            start = time.perf_counter()
            try:
                self._obj = self._load()
            except EvaluationError:
                raise
            except (ImportError, OSError, ValueError) as e:  # a missing extra, a bad path or spec
                raise EvaluationError(f"loading the {self._what}: {e}") from e
            self.load_seconds = time.perf_counter() - start
        return self._obj

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def close(self) -> None:
        """Close the loaded object if it has resources to release (an HTTP client's pool)."""
        if self._obj is not None and callable(getattr(self._obj, "close", None)):
            self._obj.close()

    def generate(self, prompts, params):
        return self._get().generate(prompts, params)

    def score(self, questions, paths):
        return self._get().score(questions, paths)

    @property
    def tokens_used(self) -> int:
        return self._get().tokens_used


def build_generator(backend: str, model: str, batch_size: int = 64, device: str | None = None, **options: Any):
    """A `Generator` for `backend` through `backends.factory.make_generator`.

    `batch_size` and `device` apply to `hf` only; `options` (from `--backend_options`) go to the
    backend as they are (vllm: `vllm.LLM` settings; openai: `base_url`, `max_concurrency`, ...).
    """
    from backends.factory import make_generator

    if backend == "hf":
        options = {"batch_size": batch_size, "device": device, **options}
    try:
        return make_generator(backend, model, **options)
    except TypeError as e:  # an option the backend does not take
        raise EvaluationError(f"--backend {backend}: bad --backend_options ({e})") from None


# ----------------------------------------------------------------------------------------------
# resumable output


def _fsync_append(path: Path, lines: Sequence[str]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(lines))
        fh.flush()
        os.fsync(fh.fileno())


def _read_jsonl(path: Path) -> tuple[list[tuple[int, dict]], bool]:
    """(line number, row) of every complete line, and whether a partial last line was dropped;
    a bad line anywhere else raises EvaluationError naming the file and line."""
    return read_resumable_jsonl(path, EvaluationError, "fix it or pass --overwrite")


def read_results(out_dir: str | os.PathLike[str]) -> list[dict]:
    """The complete rows of a run's results.jsonl (a partial last line is ignored)."""
    return [row for _, row in _read_jsonl(Path(out_dir) / RESULTS)[0]]


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return value.tolist()
    return repr(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False)


def _normalized(value: Any) -> Any:
    return json.loads(_dumps(value))


def problems_fingerprint(problems: Sequence[Problem]) -> str:
    h = hashlib.sha256()
    for p in problems:
        h.update(_dumps([p.id, p.question, p.answer, p.answer_kind, p.options]).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _settings_changed(stored: dict, run_config: dict) -> str:
    """What differs between a stored run config and this one, key by key (one level into dicts)."""
    details = []
    for k in sorted(k for k in set(stored) | set(run_config) if stored.get(k) != run_config.get(k)):
        a, b = stored.get(k), run_config.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = sorted(s for s in set(a) | set(b) if a.get(s) != b.get(s))
            details.append(f"{k} ({', '.join(f'{s}: {a.get(s)!r} -> {b.get(s)!r}' for s in sub)})")
        else:
            details.append(f"{k} ({a!r} -> {b!r})")
    return "; ".join(details)


def _kept_rows(rows: list, known: set[str], results: Path) -> tuple[dict[str, dict], int]:
    """The first row of each problem, and how many repeats were dropped; EvaluationError for a row
    without an id or with an id not of this dataset."""
    kept: dict[str, dict] = {}
    duplicates = 0
    for lineno, row in rows:
        pid = row.get("id")
        if not isinstance(pid, str):
            raise EvaluationError(f"{results}:{lineno}: row without a string 'id'; pass --overwrite")
        if pid not in known:
            raise EvaluationError(f"{results}:{lineno}: id {pid!r} is not a problem of this dataset; pass --overwrite")
        if pid in kept:
            duplicates += 1
            continue
        kept[pid] = row
    return kept, duplicates


def _recover(out: Path, run_config: dict, problems: Sequence[Problem], overwrite: bool) -> dict[str, Any]:
    """Prepare `out` for this run: check the stored config, keep complete rows, drop partial lines."""
    results, config_path, progress = out / RESULTS, out / RUN_CONFIG, out / PROGRESS
    if overwrite:
        for p in (results, config_path, progress, out / SUMMARY):
            p.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if config_path.exists():
        try:
            stored = json.loads(config_path.read_text())
        except json.JSONDecodeError as e:
            raise EvaluationError(f"{config_path}: not JSON ({e}); pass --overwrite") from None
        if stored != run_config and not _read_jsonl(results)[0]:
            # nothing was written under the old settings (e.g. a run that failed to load its model)
            progress.unlink(missing_ok=True)
            atomic_write(config_path, json.dumps(run_config, indent=2) + "\n")
        elif stored != run_config:
            raise EvaluationError(
                f"{out} holds a run with other settings: {_settings_changed(stored, run_config)}. "
                "Resume with the same settings, choose another --out, or pass --overwrite"
            )
    elif results.exists() and results.stat().st_size > 0:
        raise EvaluationError(f"{results} exists but {config_path.name} does not; pass --overwrite or choose "
                              "another --out")
    else:
        atomic_write(config_path, json.dumps(run_config, indent=2) + "\n")

    rows, partial = _read_jsonl(results)
    kept, duplicates = _kept_rows(rows, {p.id for p in problems}, results)
    if partial or duplicates:
        atomic_write(results, "".join(_dumps(r) + "\n" for r in kept.values()))
    progress_rows, progress_partial = _read_jsonl(progress)
    if progress_partial:
        atomic_write(progress, "".join(_dumps(r) + "\n" for _, r in progress_rows))
    previous_runs = sum(r.get("event") == "start" for _, r in progress_rows)
    return {"rows": kept, "partial_lines_dropped": int(partial), "duplicate_rows_dropped": duplicates,
            "run": previous_runs + 1}


# ----------------------------------------------------------------------------------------------
# the run


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


def _row(problem: Problem, output: MethodOutput, chunk: int, tracker_flags: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(output, MethodOutput):
        raise EvaluationError(f"the method returned {type(output).__name__}, not a MethodOutput")
    prediction, completion = output.prediction, output.completion or ""
    correct = prediction is not None and answer_correct(completion, problem, "flexible", prediction)
    correct_strict = prediction is not None and answer_correct(completion, problem, "strict", prediction)
    row: dict[str, Any] = {
        "id": problem.id,
        "question": problem.question,
        "answer": problem.answer,
        "answer_kind": problem.answer_kind,
        "prediction": prediction,
        "correct": bool(correct),
        "correct_strict": bool(correct_strict),
        "completion": output.completion,
        "usage": output.usage.to_dict(),
        "flags": list(tracker_flags) + list(output.flags),
        "trace": output.trace,
        "chunk": chunk,
    }
    if "world" in problem.meta:
        from reasoning.steps import split_steps
        from reasoning.world import error_kind

        row["error_kind"] = error_kind(problem, split_steps(output.completion or "").steps)
    return row


def evaluate(
    method: str | types.ModuleType,
    problems: Sequence[Problem],
    generator,
    verifier=None,
    config: Any = None,
    out_dir: str | os.PathLike[str] = "eval_out",
    *,
    chunk_size: int = 50,
    run_info: dict[str, Any] | None = None,
    verifier_is_reference: bool | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    bootstrap_samples: int = 1000,
) -> dict[str, Any]:
    """Run `method` on `problems` in chunks, grade, write `out_dir/results.jsonl` and `summary.json`.

    method: a method name or module (with `Config` and `run`); config: its `Config` (default
    `Config()`). generator / verifier: as `Tracker` takes them (the verifier may be None).
    run_info: labels stored in the run config and the summary (dataset, policy, verifier, backend,
    ...); a re-run with the same `out_dir` resumes only if they, the method config, the problems
    and `chunk_size` are the same. verifier_is_reference: whether the verifier is an upper
    reference (default: True for the world's exact verifier). Returns the summary.
    """
    module, config, problems = _checked_inputs(method, config, problems, chunk_size, run_info)
    if verifier_is_reference is None:
        verifier_is_reference = _is_reference(verifier)
    run_config = _normalized({
        "method": method_name(module),
        "method_config": _normalized(dataclasses.asdict(config)),
        **(run_info or {}),
        "seed": getattr(config, "seed", None),
        "chunk_size": chunk_size,
        "problems": {"n": len(problems), "fingerprint": problems_fingerprint(problems)},
    })
    out = Path(out_dir)
    state = _start(out, run_config, problems, overwrite, quiet)
    done: dict[str, dict] = state["rows"]
    _run_chunks(module, problems, chunk_size, done, generator, verifier, config, out, state["run"], quiet)
    return _write_summary(out, run_config, [done[p.id] for p in problems if p.id in done], len(problems),
                          bool(verifier_is_reference), bootstrap_samples)


def _write_summary(out: Path, run_config: dict, rows: list[dict], n_problems: int, verifier_is_reference: bool,
                   bootstrap_samples: int) -> dict[str, Any]:
    """The run's summary (`summarize` of its rows and progress events, with the run's labels), written
    atomically to `out/summary.json` and returned."""
    progress_rows = [r for _, r in _read_jsonl(out / PROGRESS)[0]]
    summary = summarize(rows, progress_rows, n_problems=n_problems, bootstrap_samples=bootstrap_samples)
    summary = {
        "method": run_config["method"],
        **{k: v for k, v in run_config.items() if k not in ("method", "method_config", "problems")},
        "verifier_is_reference": verifier_is_reference,
        **summary,
        "method_config": run_config["method_config"],
        "problems_fingerprint": run_config["problems"]["fingerprint"],
        "out_dir": str(out),
    }
    atomic_write(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


def _run_chunks(module, problems: list, chunk_size: int, done: dict, generator, verifier, config, out: Path,
                run: Any, quiet: bool) -> None:
    """Every chunk with a problem not yet done, in order, under a progress bar showing the accuracy
    so far; the context cap, if the tracker applied one, said once."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(problems), initial=len(done), desc=method_name(module), unit="problem", disable=quiet,
               dynamic_ncols=True)
    capped_reported = False
    try:
        for c, start in enumerate(range(0, len(problems), chunk_size)):
            chunk = problems[start : start + chunk_size]
            if all(p.id in done for p in chunk):
                continue
            rows, capped = _run_chunk(module, chunk, c, done, generator, verifier, config, out, run)
            if capped is not None and not capped_reported:
                print(f"warning: max_new_tokens is larger than the model's context: capped to {capped}",
                      file=sys.stderr)
                capped_reported = True
            bar.update(len(rows))
            finished = [r for r in done.values()]
            bar.set_postfix(acc=f"{sum(r['correct'] for r in finished) / len(finished):.3f}")
    finally:
        bar.close()


def _checked_inputs(method, config, problems, chunk_size: int, run_info) -> tuple[types.ModuleType, Any, list]:
    """The method's module, its config (default `Config()`) and the problems as a list, each checked:
    EvaluationError for a config of another method, unresolved `auto` settings, a chunk size under 1,
    repeated problem ids or an empty question."""
    module = load_method(method)
    if config is None:
        config = module.Config()
    if not isinstance(config, module.Config):
        raise EvaluationError(f"config is a {type(config).__name__}, not {module.__name__}.Config")
    from inference.methods.stepco import RevisionConfig, unresolved

    if isinstance(config, RevisionConfig) and unresolved(config):
        raise EvaluationError(f"{', '.join(unresolved(config))}: choose them first (inference.chosen_settings."
                              "choose_settings, as the command line does) or give the method numbers")
    if chunk_size < 1:
        raise EvaluationError(f"chunk_size must be >= 1, got {chunk_size}")
    problems = list(problems)
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise EvaluationError(f"problem ids are not unique (e.g. {dup!r})")
    try:
        check_questions(problems, f"--dataset {(run_info or {}).get('dataset') or 'problems'}")
    except QuestionError as err:
        raise EvaluationError(str(err)) from None
    return module, config, problems


def _start(out: Path, run_config: dict, problems: list, overwrite: bool, quiet: bool) -> dict:
    """The run's state from its folder (`_recover`), said when it resumes, with a start event logged."""
    state = _recover(out, run_config, problems, overwrite)
    done = state["rows"]
    if not quiet and (done or state["partial_lines_dropped"] or state["duplicate_rows_dropped"]):
        print(f"resuming {out}: {len(done)} of {len(problems)} problems done; dropped "
              f"{state['partial_lines_dropped']} partial line(s) and {state['duplicate_rows_dropped']} "
              "duplicate row(s)",
              file=sys.stderr)
    _fsync_append(out / PROGRESS, [_dumps({
        "event": "start", "run": state["run"], "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows_resumed": len(done), "partial_lines_dropped": state["partial_lines_dropped"],
        "duplicate_rows_dropped": state["duplicate_rows_dropped"]}) + "\n"])
    return state


def _run_chunk(module, chunk: list, c: int, done: dict, generator, verifier, config, out: Path,
               run: Any) -> tuple[list[dict], int | None]:
    """Chunk `c` run whole (same problems, same seed), so the rows written for its missing problems
    are those an uninterrupted run writes; the rows are appended, fsynced and added to `done`.
    Returns them and the token cap the tracker applied (None if none)."""
    name = method_name(module)
    todo = [i for i, p in enumerate(chunk) if p.id not in done]
    t0 = time.perf_counter()
    load_before = _load_seconds(generator) + _load_seconds(verifier)
    seed = getattr(config, "seed", None)
    cseed = chunk_seed(seed if isinstance(seed, int) else 0, c)
    has_seed = any(f.name == "seed" for f in dataclasses.fields(config))
    chunk_config = dataclasses.replace(config, seed=cseed) if has_seed else config
    _seed_everything(cseed)
    tracker = Tracker(generator, verifier, len(chunk))
    try:
        outputs = list(module.run(blind(chunk), tracker, chunk_config))
    except NoVerifierError:
        raise EvaluationError(f"method {name} needs a verifier: pass --verifier") from None
    if len(outputs) != len(chunk):
        raise EvaluationError(f"method {name} returned {len(outputs)} outputs for {len(chunk)} problems")
    rows = [_row(chunk[i], outputs[i], c, tracker.flags[i]) for i in todo]
    _fsync_append(out / RESULTS, [_dumps(r) + "\n" for r in rows])
    for r in rows:
        done[r["id"]] = _normalized(r)
    seconds = time.perf_counter() - t0
    load = _load_seconds(generator) + _load_seconds(verifier) - load_before
    _fsync_append(out / PROGRESS, [_dumps({
        "event": "chunk", "run": run, "chunk": c, "seed": cseed, "problems": len(chunk),
        "written": len(rows), "seconds": round(seconds, 4), "load_seconds": round(load, 4)}) + "\n"])
    return rows, tracker.capped_to


def _load_seconds(obj: Any) -> float:
    return obj.load_seconds if isinstance(obj, _Lazy) else 0.0


def _is_reference(verifier: Any) -> bool:
    if verifier is None:
        return False
    if getattr(verifier, "is_reference", False) is True:
        return True
    try:
        from reward_models.exact import ExactVerifier
    except ImportError:  # pragma: no cover
        return False
    return isinstance(verifier, ExactVerifier)


def _correct_strict(row: dict) -> bool:
    """A row's strict answer check; a row written before `correct_strict` existed gets it from what it
    holds (a flexible-correct prediction from a completion that states an answer, as `_row` grades it)."""
    if "correct_strict" in row:
        return bool(row["correct_strict"])
    return bool(row.get("correct")) and has_answer(row.get("completion") or "")


def summarize(rows: Sequence[dict], progress: Sequence[dict] = (), n_problems: int | None = None,
              bootstrap_samples: int = 1000) -> dict[str, Any]:
    """Accuracy under both answer checks with their intervals, compute totals and flag counts of result
    rows (plus timings from progress)."""
    n = len(rows)
    correct = sum(bool(r.get("correct")) for r in rows)
    correct_strict = sum(_correct_strict(r) for r in rows)

    def total(key: str) -> int:
        return sum(int((r.get("usage") or {}).get(key, 0)) for r in rows)

    prompt, completion, vtokens = total("prompt_tokens"), total("completion_tokens"), total("verifier_tokens")
    chunks = [p for p in progress if p.get("event") == "chunk"]
    starts = [p for p in progress if p.get("event") == "start"]
    wall = sum(float(p.get("seconds", 0.0)) for p in chunks)
    flags = Counter(f for r in rows for f in set(r.get("flags") or []))
    occurrences = Counter(f for r in rows for f in (r.get("flags") or []))
    load = sum(float(p.get("load_seconds", 0.0)) for p in chunks)
    summary: dict[str, Any] = {
        "n": n,
        "n_problems": n if n_problems is None else n_problems,
        "complete": n_problems is None or n == n_problems,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "accuracy_ci95": accuracy_interval(correct, n, bootstrap_samples),
        "correct_strict": correct_strict,
        "accuracy_strict": correct_strict / n if n else 0.0,
        "accuracy_strict_ci95": accuracy_interval(correct_strict, n, bootstrap_samples),
        "bootstrap_samples": bootstrap_samples,
        "generator_prompt_tokens": prompt,
        "generator_completion_tokens": completion,
        "verifier_tokens": vtokens,
        "total_tokens": prompt + completion + vtokens,
        "tokens_per_problem": (prompt + completion + vtokens) / n if n else 0.0,
        "llm_calls": total("llm_calls"),
        "verifier_calls": total("verifier_calls"),
        "wall_seconds": round(wall, 3),
        "load_seconds": round(load, 3),
        "method_seconds": round(wall - load, 3),
        "seconds_per_problem": round((wall - load) / n, 4) if n else 0.0,
        "no_prediction": sum(r.get("prediction") is None for r in rows),
        "prompt_too_long": sum("prompt_too_long" in (r.get("flags") or []) for r in rows),
        "flags": dict(sorted(flags.items())),
        "flag_occurrences": dict(sorted(occurrences.items())),
    }
    kinds = [r for r in rows if "error_kind" in r]
    if kinds:
        mix = Counter((r["error_kind"] or "unknown") for r in kinds if not r.get("correct"))
        summary["error_mix"] = dict(mix.most_common())
    summary["runs"] = len(starts)
    summary["resume"] = {
        "partial_lines_dropped": sum(int(p.get("partial_lines_dropped", 0)) for p in starts),
        "duplicate_rows_dropped": sum(int(p.get("duplicate_rows_dropped", 0)) for p in starts),
        "chunks_run": len(chunks),
    }
    return summary


# ----------------------------------------------------------------------------------------------
# command line


def check_server(model: str, options: dict[str, Any]) -> None:
    """One request to an OpenAI-compatible server's `/v1/models`, without retries, before anything
    is loaded: an EvaluationError when no server answers there (any HTTP answer will do)."""
    from backends.openai_compat import OpenAICompatError

    try:
        probe = build_generator("openai", model, **{**options, "max_retries": 0})
    except EvaluationError:
        raise
    except ValueError as e:
        raise EvaluationError(f"--backend openai: {e}") from None
    try:
        probe.models()
    except OpenAICompatError as err:
        if err.status is None:
            raise EvaluationError(
                f"--backend openai: no server answers at {probe.config.base_url} ({err}); start one (e.g. python -m "
                "backends.serve) or give its address: --backend_options '{\"base_url\": ...}'") from None
    finally:
        probe.close()


def _check_policy(args: EvalArguments) -> None:
    """EvaluationError (one line) for a policy the backend cannot load: not a directory for hf, or a
    local-looking path that is absent or broken (vLLM takes a Hub id too)."""
    if args.backend == "hf" and not Path(args.policy).is_dir():
        raise EvaluationError(f"--policy {args.policy}: no such directory (the hf backend loads a "
                              "save_pretrained folder)")
    if args.backend in ("hf", "vllm"):
        from backends.model_files import ModelFilesError, check_model_folder, check_model_path

        try:
            if args.backend == "hf":
                check_model_folder("--policy", args.policy)
            else:
                check_model_path("--policy", args.policy)
        except ModelFilesError as err:
            raise EvaluationError(str(err)) from None


def _checked_verifier(args: EvalArguments, world_rows) -> tuple[Any, bool]:
    """The verifier of --verifier (None without one), checked before any generation: the exact
    checker built now (cheap), any other spec checked and loaded lazily; and whether it is an upper
    reference. The registry says which kinds check world problems only."""
    if not args.verifier:
        return None, False
    from reward_models.load import check_spec, is_reference_spec, kinds_of, load_verifier, needs_policy

    spec = args.verifier
    try:
        kinds = kinds_of(spec)
        bare_confidence = needs_policy(spec)
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    world_only = [k.name for k in kinds if k.needs_world]
    if world_only and not world_rows:
        raise EvaluationError(f"the {world_only[0]} verifier checks world problems only: use --dataset world or "
                              f"a world JSONL")
    if bare_confidence and not Path(args.policy).is_dir():
        raise EvaluationError(f"{spec}: a confidence verifier reads the probabilities of a local policy: "
                              f"--policy {args.policy} is not a directory (or name one: confidence:PATH)")
    if [k.name for k in kinds] == ["exact"]:
        return load_verifier(spec, args.policy, world_rows=world_rows), is_reference_spec(spec)
    try:  # an unknown kind, a misspelt PATH, a broken model folder: said before any generation
        check_spec(spec, args.policy)
    except ValueError as e:
        raise EvaluationError(str(e)) from None
    return _Lazy(lambda: load_verifier(spec, args.policy, world_rows=world_rows, batch_size=args.verifier_batch_size,
                                       device=args.device), "verifier"), is_reference_spec(spec)


def run_from_args(args: EvalArguments, module: types.ModuleType, config: Any) -> dict[str, Any]:
    """Load the data, the (lazy) generator and verifier of the CLI settings, and evaluate."""
    _check_policy(args)
    from inference.chosen_settings import ChoiceError, check_settings, choose_settings

    try:  # StepCo's revision and θ left to auto: what cannot be used or chosen is said before anything loads
        check_settings(config, args.policy, args.dataset, args.verifier)
    except ChoiceError as err:
        raise EvaluationError(str(err)) from None
    backend_kwargs = args.backend_kwargs()
    if args.backend == "openai":
        check_server(args.policy, backend_kwargs)
    problems, world_rows = load_problems(args)
    if not problems:
        raise EvaluationError(f"--dataset {args.dataset}: no problems to evaluate")
    options = {"chat_template": args.chat_template, **backend_kwargs} if args.backend == "hf" else backend_kwargs
    generator = _Lazy(lambda: build_generator(args.backend, args.policy, batch_size=args.batch_size,
                                              device=args.device, **options), "generator")
    verifier, reference = _checked_verifier(args, world_rows)
    run_info = {"dataset": args.dataset, "policy": args.policy, "verifier": args.verifier, "backend": args.backend,
                "backend_options": backend_kwargs or None, "batch_size": args.batch_size, "limit": args.limit}
    if args.dataset == "world" or args.dataset.startswith("world:"):
        run_info.update(n_world=args.n_world, world_seed=args.world_seed)
    if not args.chat_template:  # recorded only when off, so runs from before the flag still resume
        run_info["chat_template"] = False
    try:
        from reasoning.world import world_config_of

        config, chosen = choose_settings(
            module, config, policy=args.policy, verifier_spec=args.verifier, generator=generator, verifier=verifier,
            world_config=world_config_of(args.policy if Path(args.policy).is_dir() else None),
            world_seed=args.world_seed, out_dir=args.out, batch_size=args.verifier_batch_size)
        if chosen is not None:
            run_info["chosen"] = chosen
        return evaluate(module, problems, generator, verifier, config, args.out, chunk_size=args.chunk_size,
                        run_info=run_info, verifier_is_reference=reference, overwrite=args.overwrite,
                        quiet=args.quiet, bootstrap_samples=args.bootstrap_samples)
    finally:
        for obj in (generator, verifier):
            if isinstance(obj, _Lazy):
                obj.close()


def main(argv: Sequence[str] | None = None) -> int:
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()  # torch read the thread count at import
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        args, module, config = parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag or value (2), message printed
        return e.code if isinstance(e.code, int) else 2
    except EvaluationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summary = run_from_args(args, module, config)
    except (EvaluationError, DatasetError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
