"""Step-level evaluation of a verifier: ProcessBench's earliest-error F1 and Best-of-N selection.

    python -m reward_models.verifier_metrics --verifier V --data F [--policy P]
        [--threshold θ | --calibrate-on DEV] [--rule threshold|drop]
        [--limit N [--limit_strategy stratified|spread|first] [--seed S]] [--out rows.jsonl]

`V` is anything `reward_models.load.load_verifier` takes: a PSV directory, `confidence` (with
`--policy`) or `exact` (world data only). `F` (and `DEV`) is one of

- a ProcessBench file (`../shared/data/processbench_*.jsonl`) or registry name (`processbench_gsm8k`):
  rows with `question`, `steps` and `label` (the earliest wrong step, -1 for a right path);
- a stepwise JSONL (`prompt`, `completions`) with the exact earliest error, as `earliest_error` or
  as `exact_labels` (per-step 0/1: the first step labelled < 0.5 is the earliest error; with none,
  a row whose `answer_correct` is false is a path that never states an answer);
- `world` / `world:SPLIT` (generated problems; `world` is the test split for `--data` and the dev
  split for `--calibrate-on`) or a world JSONL (rows with a `world` field), with `--policy`: paths are
  sampled from the policy and labelled exactly by `reasoning.world.earliest_error`. Then Best-of-N
  selection accuracy (`--bon_n`) is reported for every aggregation too.

**A limited run** (`--limit N`, and `--calibrate_limit` for DEV) keeps N rows of a file or a
benchmark by `--limit_strategy` (`limited_rows`). ProcessBench's files are sorted by label, so their
first N rows may hold one label only. `stratified` (the default) keeps the file's shares: the
correct (label -1) and erroneous paths in proportion, at least one of each when both are there and
N >= 2, then within the erroneous ones each earliest-error step in proportion, the rows of each
label drawn at random with `--seed`, and kept in file order. `spread` takes N rows evenly spaced
through the file (no seed); `first` the first N rows, as before. Rows without a label (a world
JSONL) form one stratum, so `stratified` draws N of them at random. Every row of the file is read
and checked except under `first`. `--data world` generates N problems, whatever the strategy.

**Metric** (ProcessBench). The predicted earliest error of a path is its first *flagged* step (-1
when none is). Accuracy on erroneous paths asks for exactly the gold index; accuracy on correct
paths asks for -1; F1 is their harmonic mean (None when either kind of path is absent).

**Decision rules.** `threshold`: step k is flagged when s_k < θ (default 0.5). `drop` (AutoPSV's
relative change): with s_0 = 1.0 before the first step, step k is flagged when
(s_k - s_{k-1}) / s_{k-1} < δ (default -0.5: the score fell to less than half of the previous
one); for the first step that is s_1 < 1 + δ. A previous score below 1e-6 is taken as 1e-6.

Paths that cannot be scored (no steps, an empty step, longer than the verifier's context) are
counted under `skipped` with their reasons; world paths whose steps are right but that never state
an answer have no earliest error in ProcessBench's sense and are counted under
`excluded_from_step_metric` (they stay Best-of-N candidates).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reasoning.benchmarks import BENCHMARKS, DatasetError, load_benchmark
from reasoning.jsonl import read_jsonl
from reward_models.load import kinds_help
from reward_models.scoring import score_paths, unscorable_reason
from reward_models.verifier import AGGREGATIONS, aggregate

RULES = ("threshold", "drop")
LIMIT_STRATEGIES = ("stratified", "spread", "first")
DEFAULT_THRESHOLD = {"threshold": 0.5, "drop": -0.5}
_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Metrics.


def rule_values(step_scores: Sequence[float], rule: str = "threshold") -> list[float]:
    """What the rule compares with its threshold, per step: the score, or its relative change."""
    if rule == "threshold":
        return [float(s) for s in step_scores]
    if rule == "drop":
        out, prev = [], 1.0
        for s in step_scores:
            out.append((float(s) - prev) / max(prev, _EPS))
            prev = float(s)
        return out
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}")


def earliest_error_predictions(
    scores: Sequence[Sequence[float]], threshold: float | None = None, rule: str = "threshold"
) -> list[int]:
    """Per path, the first step the rule flags (value < threshold), or -1 when none is."""
    if threshold is None:
        threshold = DEFAULT_THRESHOLD[rule]
    preds = []
    for step_scores in scores:
        values = rule_values(step_scores, rule)
        preds.append(next((k for k, v in enumerate(values) if v < threshold), -1))
    return preds


def processbench_metrics(pred: Sequence[int], gold: Sequence[int]) -> dict[str, Any]:
    """ProcessBench: accuracy on erroneous paths (exact index), on correct paths (-1), their F1."""
    if len(pred) != len(gold):
        raise ValueError(f"{len(pred)} predictions but {len(gold)} gold labels")
    err = [(p, g) for p, g in zip(pred, gold) if g >= 0]
    ok = [(p, g) for p, g in zip(pred, gold) if g < 0]
    acc_err = sum(p == g for p, g in err) / len(err) if err else None
    acc_ok = sum(p == -1 for p, _ in ok) / len(ok) if ok else None
    if acc_err is None or acc_ok is None:
        f1 = None
    elif acc_err + acc_ok == 0:
        f1 = 0.0
    else:
        f1 = 2 * acc_err * acc_ok / (acc_err + acc_ok)
    return {"f1": f1, "acc_erroneous": acc_err, "acc_correct": acc_ok, "n": len(gold),
            "n_erroneous": len(err), "n_correct": len(ok)}


def threshold_grid(scores: Sequence[Sequence[float]], rule: str = "threshold", points: int = 101) -> list[float]:
    """Candidate thresholds: the rule's values at `points` quantiles, the default, and one above the
    largest value (flag every path at its first step)."""
    import numpy as np

    values = np.array([v for s in scores for v in rule_values(s, rule)], dtype=float)
    grid = {DEFAULT_THRESHOLD[rule]}
    if values.size:
        grid.update(np.quantile(values, np.linspace(0, 1, points), method="lower").tolist())
        grid.add(float(np.nextafter(values.max(), math.inf)))
    return sorted(grid)


def calibrate_threshold(
    scores: Sequence[Sequence[float]], gold: Sequence[int], grid: Sequence[float] | None = None,
    rule: str = "threshold",
) -> float:
    """The threshold that maximises ProcessBench F1 on (dev) paths; ties go to the one nearest the
    rule's default. The candidates are `grid`, else `threshold_grid(scores, rule)`."""
    if len(scores) != len(gold):
        raise ValueError(f"{len(scores)} scored paths but {len(gold)} gold labels")
    if not any(g >= 0 for g in gold) or not any(g < 0 for g in gold):
        raise ValueError("calibration needs both erroneous and correct paths (F1 is undefined otherwise)")
    candidates = list(grid) if grid is not None else threshold_grid(scores, rule)
    default = DEFAULT_THRESHOLD[rule]
    best, best_key = None, None
    for t in candidates:
        f1 = processbench_metrics(earliest_error_predictions(scores, t, rule), gold)["f1"]
        key = (f1, -abs(t - default))
        if best_key is None or key > best_key:
            best, best_key = float(t), key
    return best


def best_of_n_accuracy(
    groups: Sequence[Sequence[tuple[Sequence[float] | None, bool]]], how: str | Sequence[str] = AGGREGATIONS
) -> dict[str, Any]:
    """Best-of-N: per problem, pick the path whose `aggregate(scores, how)` is highest.

    `groups` holds, per problem, (step scores, final answer correct) for its N paths; scores None
    for a path the verifier could not score (never picked). Ties count as a uniformly random pick
    among the tied paths (expected accuracy). Returns the accuracy per aggregation, `oracle`
    (pass@N: some path is correct) and `random` (the expected accuracy of a random pick).
    """
    hows = [how] if isinstance(how, str) else list(how)
    if not groups:
        raise ValueError("no groups")
    out: dict[str, Any] = {"groups": len(groups), "n": max(len(g) for g in groups)}
    for h in hows:
        total = 0.0
        for group in groups:
            scored = [(aggregate(s, h), ok) for s, ok in group if s]
            if not scored:
                continue
            top = max(a for a, _ in scored)
            tied = [ok for a, ok in scored if a >= top - 1e-12]
            total += sum(tied) / len(tied)
        out[h] = total / len(groups)
    out["oracle"] = sum(any(ok for _, ok in g) for g in groups) / len(groups)
    out["random"] = sum(sum(ok for _, ok in g) / len(g) for g in groups if g) / len(groups)
    out["unscored_groups"] = sum(not any(s for s, _ in g) for g in groups)
    return out


# ---------------------------------------------------------------------------------------------
# Data.


@dataclass
class PathItem:
    """One path to score: its question, steps and exact earliest error."""

    id: str
    problem_id: str
    question: str
    steps: list
    gold: int
    """Index of the earliest wrong step; -1 for a right path; len(steps) for a world path with no answer."""
    is_correct: bool | None = None
    """Whether the final answer is right (sampled world paths)."""
    excluded: str | None = None
    """Why the step metric leaves this path out (a world path that never states an answer)."""


@dataclass
class EvalSet:
    name: str
    kind: str
    """processbench, stepwise or world."""
    items: list[PathItem]
    world_rows: list[dict] = field(default_factory=list)


def row_kind(row: Any, where: str) -> str:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "completions" in row:
        return "stepwise"
    if "steps" in row and "label" in row:
        return "processbench"
    if "world" in row:
        return "world"
    raise DatasetError(
        f"{where}: not a ProcessBench row (question, steps, label), a stepwise row (prompt, completions, "
        "earliest_error or exact_labels) or a world row (world)"
    )


def _int_label(value: Any, where: str, name: str, n_steps: int, allow_end: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DatasetError(f"{where}: {name} must be an integer, got {value!r}")
    top = n_steps if allow_end else n_steps - 1
    if not -1 <= value <= top:
        raise DatasetError(f"{where}: {name} = {value} is outside [-1, {top}] for {n_steps} steps")
    return value


def item_from_row(row: dict, kind: str, index: int, where: str) -> PathItem:
    """A PathItem from a ProcessBench or stepwise row."""
    rid = str(row.get("id", index))
    if kind == "processbench":
        question, steps = row.get("question", row.get("problem")), row["steps"]
        if not isinstance(steps, list):
            raise DatasetError(f"{where}: steps must be a list of strings")
        gold = _int_label(row["label"], where, "label", len(steps)) if steps else -1
    else:
        question, steps = row.get("prompt"), row["completions"]
        if not isinstance(steps, list):
            raise DatasetError(f"{where}: completions must be a list of strings")
        if "earliest_error" in row:
            gold = _int_label(row["earliest_error"], where, "earliest_error", len(steps), allow_end=True)
        elif "exact_labels" in row:
            labels = row["exact_labels"]
            if not isinstance(labels, list) or len(labels) != len(steps):
                raise DatasetError(f"{where}: exact_labels must be a list with one number per step")
            if not all(isinstance(y, (int, float)) for y in labels):
                raise DatasetError(f"{where}: exact_labels must be numbers")
            gold = next((k for k, y in enumerate(labels) if y < 0.5), -1)
            if gold == -1 and row.get("answer_correct") is False:
                gold = len(steps)  # every step right, yet no right answer: the path never states one
        else:
            raise DatasetError(f"{where}: a stepwise row needs its exact earliest error (earliest_error or "
                               "exact_labels)")
    if not isinstance(question, str):
        raise DatasetError(f"{where}: the question must be a string")
    item = PathItem(rid, rid, question, steps, gold)
    if steps and gold == len(steps):
        item.excluded = "missing_answer"
    return item


def _largest_remainder(sizes: Sequence[int], k: int) -> list[int]:
    """k split over groups of `sizes` in proportion (Hamilton's largest remainders; ties to the
    earlier group); no group gets more than its size when k <= sum(sizes)."""
    total = sum(sizes)
    quotas = [k * s / total if total else 0.0 for s in sizes]
    alloc = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(sizes)), key=lambda g: (-(quotas[g] - alloc[g]), g))
    for g in by_remainder[: k - sum(alloc)]:
        alloc[g] += 1
    return alloc


def limited_rows(labels: Sequence[int | None], limit: int, strategy: str = "stratified", seed: int = 0) -> list[int]:
    """The indices (ascending) of the `limit` rows a limited run keeps, by `strategy` (LIMIT_STRATEGIES;
    see the module docstring); `labels` are the rows' earliest-error labels (-1: no error; None:
    unlabelled). Deterministic given `seed`."""
    if strategy not in LIMIT_STRATEGIES:
        raise ValueError(f"--limit_strategy must be one of {', '.join(LIMIT_STRATEGIES)}; got {strategy!r}")
    n = len(labels)
    if limit < 0:
        raise ValueError(f"--limit must be >= 0, got {limit}")
    if limit >= n:
        return list(range(n))
    if strategy == "first":
        return list(range(limit))
    if strategy == "spread":
        return [i * n // limit for i in range(limit)]
    # stratified: the correct / erroneous / unlabelled shares first, then each label within its share
    shares: dict[str, dict[int | None, list[int]]] = {}
    for i, label in enumerate(labels):
        share = "unlabelled" if label is None else "correct" if label == -1 else "erroneous"
        shares.setdefault(share, {}).setdefault(label, []).append(i)
    names = sorted(shares)
    sizes = [sum(len(rows) for rows in shares[s].values()) for s in names]
    alloc = _largest_remainder(sizes, limit)
    if limit >= len(names):  # a share present in the file is present in the sample (F1 needs both kinds)
        for g in range(len(names)):
            if alloc[g] == 0:
                alloc[max(range(len(names)), key=lambda h: alloc[h])] -= 1
                alloc[g] = 1
    rng = random.Random(seed)
    kept: list[int] = []
    for name, k in zip(names, alloc):
        strata = sorted(shares[name].items(), key=lambda kv: -2 if kv[0] is None else kv[0])
        for (_, rows), m in zip(strata, _largest_remainder([len(rows) for _, rows in strata], k)):
            kept += rng.sample(rows, m)
    return sorted(kept)


def _world_config_for(policy: str | None):
    from reasoning.world import world_config_of

    return world_config_of(policy)


def sample_world_paths(generator, rows: Sequence[dict], samples: int, params) -> list[PathItem]:
    """`samples` paths per world problem from the policy, labelled exactly by the world's checker."""
    from reasoning.grading import grade
    from reasoning.prompts import solve_prompt
    from reasoning.steps import split_steps
    from reasoning.world import earliest_error, row_to_problem

    outputs = generator.generate([solve_prompt(r["question"]) for r in rows], params)
    items = []
    for row, completions in zip(rows, outputs):
        problem = row_to_problem(row)
        for j, completion in enumerate(completions[:samples]):
            steps = split_steps(completion.text).steps
            gold = earliest_error(row, steps)
            item = PathItem(f"{row['id']}#s{j}", row["id"], row["question"], steps, gold,
                            is_correct=grade(completion.text, problem).correct)
            if steps and gold == len(steps):
                item.excluded = "missing_answer"
            items.append(item)
    return items


def _read_rows(data: str, first: int | None) -> tuple[str, list[dict], list[int], str]:
    """(source, rows, their line numbers, their one kind) of a benchmark name or a JSONL file, the
    first `first` rows only when given; DatasetError for no rows, rows of mixed kinds or a world row
    without its world."""
    if data.strip().lower().replace("-", "_") in BENCHMARKS:
        problems = load_benchmark(data, limit=first)
        rows = [{"id": p.id, "question": p.question, **p.meta} for p in problems]
        source, lines = data, list(range(1, len(rows) + 1))
    else:
        if not Path(data).is_file():
            raise FileNotFoundError(f"no such data file or benchmark name: {data}")
        rows, lines = read_jsonl(data)
        if first is not None:
            rows, lines = rows[:first], lines[:first]
        source = data
    if not rows:
        raise DatasetError(f"{source}: no rows")
    kinds = [row_kind(r, f"{source}:{ln}") for r, ln in zip(rows, lines)]
    kind = kinds[0]
    for k, ln in zip(kinds, lines):
        if k != kind:
            raise DatasetError(f"{source}:{ln}: a {k} row in a file of {kind} rows")
    if kind == "world":
        for row, ln in zip(rows, lines):
            world = row["world"]
            if not (isinstance(world, dict) and isinstance(world.get("quantities"), dict)
                    and isinstance(world.get("target"), str) and world["target"] in world["quantities"]
                    and isinstance(row.get("question"), str)):
                raise DatasetError(f"{source}:{ln}: not a world row: needs 'question' and a 'world' object "
                                   "with 'quantities' and a 'target' among them")
    return source, rows, lines, kind


def load_eval_set(data: str, args: EvalArguments, generator_factory, default_split: str = "test",
                  limit: int | None = None) -> EvalSet:
    """The paths of `data` (see the module docstring); world problems are sampled from the policy."""
    from reasoning.world import generate

    world_rows: list[dict] = []
    if data == "world" or data.startswith("world:"):
        split = data.partition(":")[2] or default_split
        n = limit if limit is not None else args.world_n
        world_rows = generate(split, n, args.world_seed, _world_config_for(args.policy))
        kind = "world"
    else:
        source, rows, lines, kind = _read_rows(data, limit if args.limit_strategy == "first" else None)
        if kind != "world":
            items = [item_from_row(r, kind, i, f"{source}:{ln}") for i, (r, ln) in enumerate(zip(rows, lines))]
            if limit is not None:
                items = [items[i] for i in limited_rows([it.gold for it in items], limit, args.limit_strategy,
                                                        args.seed)]
                if not items:
                    raise DatasetError(f"{source}: no rows (--limit {limit})")
            return EvalSet(data, kind, items)
        world_rows = rows
        if limit is not None:
            world_rows = [rows[i] for i in limited_rows([None] * len(rows), limit, args.limit_strategy, args.seed)]
    from backends.base import SamplingParams

    if not args.policy:
        raise ValueError(f"{data}: world problems need --policy to sample the paths to evaluate")
    if args.bon_n > args.samples_per_problem:
        raise ValueError(f"--bon_n {args.bon_n} needs at least that many --samples_per_problem")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            n=args.samples_per_problem, seed=args.seed)
    items = sample_world_paths(generator_factory(), world_rows, args.samples_per_problem, params)
    return EvalSet(data, "world", items, world_rows)


# ---------------------------------------------------------------------------------------------
# Scoring with failures counted (`reward_models.scoring`).


def score_items(verifier, items: Sequence[PathItem], batch_size: int = 32,
                progress: bool = False) -> tuple[list[list[float] | None], list[tuple[str, str] | None]]:
    """Scores per path (None where it could not be scored, `reward_models.scoring.score_paths`) and
    the failures as (reason, message)."""
    batches = None
    if progress:
        from tqdm.auto import tqdm

        def batches(starts):
            return tqdm(starts, desc="scoring", unit="batch")

    scored = score_paths(verifier, [it.question for it in items], [it.steps for it in items],
                         batch_size=batch_size, batches=batches)
    reasons: list[tuple[str, str] | None] = [None] * len(items)
    for i, message in scored.errors.items():
        reasons[i] = (unscorable_reason(message), message)
    return scored.scores, reasons


def step_metric_inputs(items, scores) -> tuple[list[list[float]], list[int], list[int]]:
    """(scores, gold, item indices) of the paths the step metric counts."""
    idx = [i for i, (it, s) in enumerate(zip(items, scores)) if s is not None and it.excluded is None]
    return [scores[i] for i in idx], [items[i].gold for i in idx], idx


# ---------------------------------------------------------------------------------------------
# CLI.


@dataclass
class EvalArguments:
    """What to evaluate, on what, and how a step is flagged."""

    verifier: str | None = field(
        default=None, metadata={"help": "A verifier spec (reward_models.load; a bare confidence kind reads "
                                        f"--policy, exact needs world data): {kinds_help()}."}
    )
    data: str | None = field(
        default=None,
        metadata={"help": "ProcessBench file or name, stepwise JSONL with exact labels, world or world:SPLIT, "
                          "or a world JSONL (world data needs --policy)."},
    )
    policy: str | None = field(
        default=None, metadata={"help": "Policy directory: samples world paths; the confidence verifier reads it."}
    )
    threshold: float | None = field(
        default=None, metadata={"help": "Decision threshold; default 0.5 (threshold rule) or -0.5 (drop rule)."}
    )
    calibrate_on: str | None = field(
        default=None, metadata={"help": "Pick the threshold maximising F1 on this dev data (same kinds as --data)."}
    )
    rule: str = field(
        default="threshold",
        metadata={"help": "threshold: flag s_k < θ; drop: flag (s_k - s_{k-1}) / s_{k-1} < θ with s_0 = 1.",
                  "choices": list(RULES)},
    )
    limit: int | None = field(default=None, metadata={
        "help": "N rows of --data, chosen by --limit_strategy (world: N generated problems)."})
    limit_strategy: str = field(
        default="stratified",
        metadata={"help": "Which rows --limit and --calibrate_limit keep. stratified: the correct (label -1) and "
                          "erroneous shares of the file, and each earliest-error step within the erroneous one, "
                          "in proportion (at least one of each kind), drawn with --seed (ProcessBench files are "
                          "sorted by label, so their first rows may hold one label only); spread: N rows evenly "
                          "spaced through the file; first: the first N rows.",
                  "choices": list(LIMIT_STRATEGIES)},
    )
    calibrate_limit: int | None = field(
        default=None, metadata={"help": "N rows (world: problems) of --calibrate-on, by --limit_strategy; default "
                                        "--limit."}
    )
    out: str | None = field(default=None, metadata={"help": "JSONL with one row per path (scores, gold, prediction)."})
    samples_per_problem: int = field(default=8, metadata={"help": "World: paths sampled per problem."})
    bon_n: int = field(default=8, metadata={"help": "World: Best-of-N over the first N samples of each problem."})
    temperature: float = field(default=1.0, metadata={"help": "World: sampling temperature."})
    top_p: float = field(default=1.0, metadata={"help": "World: nucleus sampling."})
    max_new_tokens: int = field(default=192, metadata={"help": "World: generation limit per path."})
    seed: int = field(default=0, metadata={"help": "World: sampling seed; also the draw of --limit_strategy "
                                                   "stratified."})
    world_n: int = field(default=100, metadata={"help": "World: problems generated when --data is world."})
    world_seed: int = field(default=0, metadata={"help": "World: seed of the generated problems."})
    batch_size: int = field(default=32, metadata={"help": "Paths per verifier forward pass."})
    gen_batch_size: int = field(default=64, metadata={"help": "Sequences per generation batch."})
    device: str | None = field(default=None, metadata={"help": "cuda or cpu; default cuda when available."})

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        if self.threshold is not None and self.calibrate_on is not None:
            raise ValueError("give --threshold or --calibrate-on, not both")
        if self.bon_n < 1 or self.samples_per_problem < 1:
            raise ValueError("bon_n and samples_per_problem must be >= 1")
        if self.limit_strategy not in LIMIT_STRATEGIES:
            raise ValueError(f"--limit_strategy must be one of {', '.join(LIMIT_STRATEGIES)}; got "
                             f"{self.limit_strategy!r}")
        for name in ("limit", "calibrate_limit"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")


def _skipped(reasons: Sequence[tuple[str, str] | None]) -> dict[str, Any]:
    """Counts per reason, and the first message of each reason (so a systematic failure shows)."""
    counts = Counter(r[0] for r in reasons if r is not None)
    examples: dict[str, str] = {}
    for r in reasons:
        if r is not None:
            examples.setdefault(r[0], r[1][:300])
    return {"total": sum(counts.values()), "reasons": dict(counts.most_common()), "examples": examples}


def calibrate_on_items(verifier, items: Sequence[PathItem], batch_size: int = 32,
                       rule: str = "threshold") -> dict[str, Any]:
    """`--calibrate-on`: score held-apart paths with their exact earliest errors and pick the
    threshold that maximises ProcessBench F1 there (`calibrate_threshold`). Returns `threshold`, that
    `f1`, `n` (the paths the step metric counts) and `skipped` (paths the verifier could not score).
    Also what `inference.chosen_settings` calibrates StepCo's θ with."""
    scores, reasons = score_items(verifier, items, batch_size)
    s, g, _ = step_metric_inputs(items, scores)
    threshold = calibrate_threshold(s, g, rule=rule)
    metrics = processbench_metrics(earliest_error_predictions(s, threshold, rule), g)
    return {"threshold": threshold, "f1": metrics["f1"], "n": metrics["n"], "skipped": _skipped(reasons)}


def evaluate(args: EvalArguments) -> dict[str, Any]:
    """Load, sample (world), score, calibrate, measure; returns the summary and writes `args.out`."""
    from backends.model_files import check_model_path
    from reward_models.load import check_spec, load_verifier

    if not args.verifier or not args.data:
        raise ValueError("--verifier and --data are required")
    check_spec(args.verifier, args.policy)  # a typo fails here, not after sampling and scoring
    if args.policy:
        check_model_path("--policy", args.policy)
    if args.out and Path(args.out).is_dir():
        raise ValueError(f"--out {args.out}: a directory; name the JSONL file to write the rows to")
    start = time.time()
    generator = None

    def generator_factory():
        nonlocal generator
        if generator is None:
            from backends.hf import HFGenerator

            generator = HFGenerator.from_pretrained(args.policy, batch_size=args.gen_batch_size, device=args.device)
        return generator

    test = load_eval_set(args.data, args, generator_factory, "test", args.limit)
    dev = None
    if args.calibrate_on:
        limit = args.calibrate_limit if args.calibrate_limit is not None else args.limit
        dev = load_eval_set(args.calibrate_on, args, generator_factory, "dev", limit)
    world_rows = test.world_rows + (dev.world_rows if dev else [])
    verifier = load_verifier(args.verifier, args.policy, world_rows=world_rows, batch_size=args.batch_size,
                             device=args.device)
    result: dict[str, Any] = {"verifier": args.verifier, "data": args.data, "kind": test.kind, "rule": args.rule}
    if args.limit is not None or args.calibrate_limit is not None:
        result.update(limit=args.limit, limit_strategy=args.limit_strategy)
    threshold = args.threshold if args.threshold is not None else DEFAULT_THRESHOLD[args.rule]
    if dev is not None:
        calibration = calibrate_on_items(verifier, dev.items, args.batch_size, args.rule)
        threshold = calibration.pop("threshold")
        result["calibration"] = {"data": args.calibrate_on, **calibration}
    tokens_before = verifier.tokens_used
    scores, reasons = score_items(verifier, test.items, args.batch_size, progress=True)
    result["verifier_tokens"] = verifier.tokens_used - tokens_before
    s, g, idx = step_metric_inputs(test.items, scores)
    preds = earliest_error_predictions(s, threshold, args.rule)
    result.update(processbench_metrics(preds, g))
    result["threshold"] = threshold
    result["skipped"] = _skipped(reasons)
    excluded = Counter(it.excluded for it, sc in zip(test.items, scores) if it.excluded and sc is not None)
    result["excluded_from_step_metric"] = dict(excluded)
    if test.kind == "world":
        result.update(_world_path_metrics(test.items, scores, args.bon_n))
    result["seconds"] = round(time.time() - start, 2)
    if args.out:
        _write_rows(Path(args.out), test.items, scores, reasons, dict(zip(idx, preds)))
    return result


def _world_path_metrics(items: list, scores: list, bon_n: int) -> dict[str, Any]:
    """The sampled paths' count and accuracy, and Best-of-`bon_n` accuracy under each aggregation."""
    by_problem: dict[str, list] = {}
    for item, sc in zip(items, scores):
        group = by_problem.setdefault(item.problem_id, [])
        if len(group) < bon_n:
            group.append((sc, bool(item.is_correct)))
    result: dict[str, Any] = {"paths": len(items),
                              "sample_accuracy": sum(bool(it.is_correct) for it in items) / max(len(items), 1)}
    if by_problem:
        result["best_of_n"] = best_of_n_accuracy(list(by_problem.values()), AGGREGATIONS)
    return result


def _write_rows(out: Path, items: list, scores: list, reasons: list, pred_of: dict[int, Any]) -> None:
    """One JSONL row per path: the item without its question, its scores, prediction and skip reason."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for i, (item, sc, reason) in enumerate(zip(items, scores, reasons)):
            row = {k: v for k, v in asdict(item).items() if k != "question"}
            row.update(scores=sc, pred=pred_of.get(i), skipped=reason[0] if reason else None)
            fh.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()  # torch read the thread count at import
    try:
        (args,) = TrlParser((EvalArguments,)).parse_args_and_config(args=argv)
        result = evaluate(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
