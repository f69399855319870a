"""The arithmetic world: procedurally generated multi-step word problems with checkable steps.

A problem is a small graph of named quantities ("Ben has 4 more marbles than Ava") with one
target. The gold solution computes each needed quantity in one step, then states the answer:

    <Step>Ben has 7 + 4 = 11 marbles.</Step>
    <Step>Ava now has 7 - 2 = 5 marbles.</Step>
    <Step>The answer is <ans>16</ans>.</Step>

Errors a policy can make are mostly *decisions*, as on GSM8K: which quantity a sentence refers to
(a person's count before or after an event), which operation a phrase means ("Ava has 3 fewer
than Ben" makes Ben's count a sum), numbers in distractor sentences that look usable, and
dependencies spread over several sentences. Arithmetic slips remain possible but numbers are kept
small by default so they are not the main source of error.

Every step names the quantity it computes, so each step of any path (gold, generated or
corrupted) is checked exactly against the problem's quantities: `check_steps` returns a verdict
per step and `earliest_error` the index of the first wrong step (-1 when the path is right).

CLI: ``python -m reasoning.world --split test --n 500 --seed 0 --out world_test.jsonl``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from pathlib import Path
from typing import Any

from reasoning.arith import try_evaluate
from reasoning.types import Problem

NAMES = "Ava Ben Cal Dan Eve Fay Gus Hal Ivy Jay Kim Leo Mia Ned Pam Ray Sam Tom Uma Zoe".split()
ITEMS = "marbles apples stickers coins books pencils cards shells".split()
OTHER_ITEMS = "pens kites buttons cups".split()
IRRELEVANT = (
    "{p} is {k} years old.",
    "{p} lives {k} miles from school.",
    "{p}'s brother is {k} years old.",
    "The shop opens at {k} in the morning.",
    "{p} walks {k} blocks every day.",
)

# Phrasings. Each relation defines the NEW quantity `new` from an existing one `old` with constant k.
# "direct" phrasings name the operation; "inverse" phrasings state the relation from the other side
# ("Ava has 3 fewer than Ben" defines Ben = Ava + 3), a classic decision trap.
REL_PHRASES = {
    "add": {
        "direct": ["{new} has {k} more {item} than {old}.", "{new} has {k} {item} more than {old}."],
        "inverse": ["{old} has {k} fewer {item} than {new}."],
    },
    "sub": {
        "direct": ["{new} has {k} fewer {item} than {old}.", "{new} has {k} {item} less than {old}."],
        "inverse": ["{old} has {k} more {item} than {new}."],
    },
    "mul": {
        "direct": ["{new} has {times} as many {item} as {old}."],
        "inverse": ["{old} has {frac} as many {item} as {new}."],
    },
    "div": {
        "direct": ["{new} has {frac} as many {item} as {old}."],
        "inverse": ["{old} has {times} as many {item} as {new}."],
    },
}
TIMES = {2: "twice", 3: "three times", 4: "four times", 5: "five times"}
FRACS = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}
GAIN_PHRASES = ["{p} buys {k} more {item}.", "{p} finds {k} more {item}.", "{p} gets {k} more {item} from a friend."]
LOSE_PHRASES = ["{p} gives away {k} {item}.", "{p} loses {k} {item}.", "{p} sells {k} {item}."]
SUM_PHRASES = [
    "{new} has as many {item} as {a} and {b} together.",
    "{new} has as many {item} as {a} and {b} combined.",
]
DIFF_PHRASES = ["{new} has as many {item} as the difference between {a} and {b}."]
OP_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "sum": "+", "diff": "-", "gain": "+", "lose": "-"}

TOTAL_KEY = "@total"
ERROR_KINDS = ("format", "slip", "misread_inverse", "misread_stale", "misread_direct", "wrong_operand",
               "wrong_operation", "wrong_answer", "unknown_quantity", "other")
"""Kinds of step error. A wrong step that only carries an earlier error forward is `propagated`.
`misread_inverse`: an inversely phrased relation computed with the operation its words name
('Ava has 3 fewer than Ben' read as Ben = Ava - 3); `misread_stale`: a person's count before an
event used where the count after it is meant; `misread_direct`: the mirror of `misread_inverse`, a
directly phrased relation computed with the inverse operation ('Ava has 3 fewer than Ben' computed as
Ben + 3), what a reader who learned to flip relations without telling which ones are inverse writes.
No teacher writes it; RL that unlearns the inverse misreading can."""
MISREADINGS = ("inverse", "stale")
"""The decisions a weaker teacher gets wrong (`teacher_solution`), by kind."""
INVERSE_OP = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}
RELATION_OPS = ("add", "sub", "mul", "div", "sum", "diff")


@dataclass
class WorldConfig:
    """Difficulty knobs of the arithmetic world. Defaults are the embedded CPU default."""

    min_steps: int = 1
    """Fewest computation steps in a gold solution (the answer step comes on top)."""
    max_steps: int = 3
    """Most computation steps in a gold solution (2-8)."""
    max_base: int = 10
    """Given counts are drawn from [2, max_base]."""
    max_delta: int = 5
    """Constants in 'k more / k fewer / buys k' are drawn from [1, max_delta]."""
    max_factor: int = 3
    """Largest factor in 'k times as many' / '1/k as many' (2-5)."""
    max_value: int = 60
    """No quantity in a problem exceeds this."""
    ops: tuple[str, ...] = ("add", "sub", "mul", "div", "sum", "diff", "gain", "lose")
    """Step kinds the generator may use."""
    p_inverse: float = 0.25
    """Probability that a relation is phrased from the other side ('Ava has 3 fewer than Ben')."""
    min_distractors: int = 0
    """Fewest distractor sentences."""
    max_distractors: int = 1
    """Most distractor sentences (unused relations, other items, irrelevant numbers)."""
    p_together: float = 0.2
    """Probability that the question asks for two people's counts together (one more step)."""
    n_names: int = 10
    """How many of the world's names problems draw people from (fewer: easier to tell apart)."""
    n_items: int = 4
    """How many of the world's item kinds problems draw from."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps <= 8:
            raise ValueError(f"need 1 <= min_steps <= max_steps <= 8, got {self.min_steps}, {self.max_steps}")
        if not 2 <= self.max_factor <= 5:
            raise ValueError(f"max_factor must be in [2, 5], got {self.max_factor}")
        if self.max_base < 2 or self.max_delta < 1 or self.max_value < self.max_base:
            raise ValueError("need max_base >= 2, max_delta >= 1 and max_value >= max_base")
        unknown = set(self.ops) - set(OP_SYMBOL)
        if unknown or not self.ops:
            raise ValueError(f"unknown ops {sorted(unknown)}; choose from {sorted(OP_SYMBOL)}")
        if not 0 <= self.min_distractors <= self.max_distractors:
            raise ValueError("need 0 <= min_distractors <= max_distractors")
        if not 4 <= self.n_names <= len(NAMES) or not 1 <= self.n_items <= len(ITEMS):
            raise ValueError(f"need 4 <= n_names <= {len(NAMES)} and 1 <= n_items <= {len(ITEMS)}")
        for name in ("p_inverse", "p_together"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, got {getattr(self, name)}")
        self.ops = tuple(self.ops)


@dataclass
class Quantity:
    key: str
    """'Ben' (a person's count), 'Ben@now' (after an event) or '@total'."""
    value: int
    op: str | None = None
    """None for a given count, else a key of OP_SYMBOL."""
    args: list[Any] = field(default_factory=list)
    """Operands: quantity keys (str) or constants (int), in the order the gold step writes them."""
    needed: bool = False
    """Whether the gold solution computes it."""
    inverse: bool = False
    """Whether its sentence states the relation from the other side ('Ava has 3 fewer than Ben'
    defines Ben = Ava + 3): the decision a weaker reader misreads as Ben = Ava - 3."""


# ---------------------------------------------------------------------------------------------
# Step text: one format shared by the generator, the corruptor and the checker.

_STEP_RE = re.compile(
    r"^(?:(?P<who>[A-Z][a-z]+) (?P<now>now )?has|(?P<together>Together they) have) "
    r"(?P<expr>[-+*/() 0-9]+?) = (?P<res>-?[0-9]+) (?P<item>[a-z]+)\.?$"
)
_ANSWER_RE = re.compile(r"answer is\s*(?:<ans>)?\s*(-?[0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def quantity_subject(key: str) -> str:
    if key == TOTAL_KEY:
        return "Together they have"
    person, _, state = key.partition("@")
    return f"{person} now has" if state == "now" else f"{person} has"


def step_text(key: str, expr: str, value: Any, item: str) -> str:
    return f"{quantity_subject(key)} {expr} = {value} {item}."


def answer_step(value: Any) -> str:
    return f"The answer is <ans>{value}</ans>."


def _fmt(value: Fraction | int) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else str(float(value))


# ---------------------------------------------------------------------------------------------
# Generation.


class _OutOfNames(Exception):
    """The problem needs more people than there are names: it is discarded and drawn again."""


class _Builder:
    def __init__(self, rng: random.Random, cfg: WorldConfig):
        self.rng = rng
        self.cfg = cfg
        self.item = rng.choice(ITEMS[: cfg.n_items])
        self.names = rng.sample(NAMES[: cfg.n_names], cfg.n_names)
        self.quantities: dict[str, Quantity] = {}
        self.latest: dict[str, str] = {}  # person -> key of their current count
        self.sentences: list[str] = []
        self.order: list[str] = []  # derived keys in solution order

    def new_person(self) -> str:
        if not self.names:
            raise _OutOfNames
        return self.names.pop()

    def given(self, person: str | None = None) -> str:
        person = person or self.new_person()
        value = self.rng.randint(2, self.cfg.max_base)
        self.quantities[person] = Quantity(person, value)
        self.latest[person] = person
        self.sentences.append(f"{person} has {value} {self.item}.")
        return person

    def derive(self, key: str, op: str, args: list[Any], value: int, sentence: str) -> str:
        self.quantities[key] = Quantity(key, value, op, args)
        self.latest[key.partition("@")[0]] = key
        self.sentences.append(sentence)
        self.order.append(key)
        return key

    def value(self, key: str) -> int:
        return self.quantities[key].value

    def try_step(self, current: str, op: str) -> str | None:
        rng, cfg, item = self.rng, self.cfg, self.item
        a = self.value(current)
        person = current.partition("@")[0]
        if op in ("add", "sub", "mul", "div"):
            inverse = rng.random() < cfg.p_inverse
            extra: dict[str, int | str]  # the template's words beyond the people and the item
            if op in ("add", "sub"):
                k = rng.randint(1, cfg.max_delta)
                value = a + k if op == "add" else a - k
                extra = {"k": k}
            else:
                choices = [f for f in range(2, cfg.max_factor + 1) if op == "mul" or a % f == 0]
                if not choices:
                    return None
                k = rng.choice(choices)
                value = a * k if op == "mul" else a // k
                extra = {"times": TIMES[k], "frac": FRACS[k]}
            if not 1 <= value <= cfg.max_value:
                return None
            new = self.new_person()
            template = rng.choice(REL_PHRASES[op]["inverse" if inverse else "direct"])
            sentence = template.format(new=new, old=person, item=item, **extra)
            key = self.derive(new, op, [current, k], value, sentence)
            self.quantities[key].inverse = inverse
            return key
        if op in ("gain", "lose"):
            if self.latest.get(person) != current or "@" in current:
                return None  # one event per person, applied to their current count
            k = rng.randint(1, cfg.max_delta)
            value = a + k if op == "gain" else a - k
            if not 1 <= value <= cfg.max_value:
                return None
            template = rng.choice(GAIN_PHRASES if op == "gain" else LOSE_PHRASES)
            return self.derive(f"{person}@now", op, [current, k], value, template.format(p=person, k=k, item=item))
        if op in ("sum", "diff"):
            others = [key for p, key in self.latest.items() if key != current]
            if not others:
                return None
            other = rng.choice(others)
            b = self.value(other)
            first, second = (current, other) if rng.random() < 0.5 else (other, current)
            if op == "sum":
                value = a + b
                template = rng.choice(SUM_PHRASES)
            else:
                if a == b:
                    return None
                if self.value(first) < self.value(second):
                    first, second = second, first
                value = self.value(first) - self.value(second)
                template = rng.choice(DIFF_PHRASES)
            if not 1 <= value <= cfg.max_value:
                return None
            new = self.new_person()
            sentence = template.format(
                new=new, a=first.partition("@")[0], b=second.partition("@")[0], item=item
            )
            return self.derive(new, op, [first, second], value, sentence)
        raise ValueError(f"unknown op {op}")


def _distractor(b: _Builder) -> tuple[str, str | None, Quantity | None]:
    """A distractor sentence, the person it mentions (or None) and the unused quantity it defines."""
    rng = b.rng
    kind = rng.choice(("unused_relation", "other_item", "irrelevant_number"))
    people = list(b.latest)
    person = rng.choice(people)
    if kind == "unused_relation":
        a = b.value(b.latest[person])
        k = rng.randint(1, b.cfg.max_delta)
        op = rng.choice(("add", "sub"))
        value = a + k if op == "add" else a - k
        if value >= 1:
            new = b.new_person()
            sentence = rng.choice(REL_PHRASES[op]["direct"]).format(new=new, old=person, item=b.item, k=k)
            return sentence, person, Quantity(new, value, op, [b.latest[person], k])
        kind = "other_item"
    k = rng.randint(2, b.cfg.max_base)
    if kind == "other_item":
        return f"{person} also has {k} {rng.choice(OTHER_ITEMS)}.", person, None
    template = rng.choice(IRRELEVANT)
    return template.format(p=person, k=k), (person if "{p}" in template else None), None


def _generate_one(rng: random.Random, cfg: WorldConfig) -> dict[str, Any] | None:
    try:
        return _build_problem(rng, cfg)
    except _OutOfNames:
        return None


def _build_problem(rng: random.Random, cfg: WorldConfig) -> dict[str, Any] | None:
    b = _Builder(rng, cfg)
    n_steps = rng.randint(cfg.min_steps, cfg.max_steps)
    together = rng.random() < cfg.p_together and n_steps >= 2
    n_chain = n_steps - 1 if together else n_steps
    current = b.given()
    if rng.random() < 0.5:
        b.given()
    for _ in range(n_chain):
        ops = list(cfg.ops)
        rng.shuffle(ops)
        for op in ops:
            if op in ("sum", "diff") and len(b.latest) < 2:
                b.given()
            made = b.try_step(current, op)
            if made:
                current = made
                break
        else:
            return None
    if together:
        others = [key for key in b.latest.values() if key != current]
        if not others:
            return None
        other = rng.choice(others)
        value = b.value(current) + b.value(other)
        if value > cfg.max_value:
            return None
        b.quantities[TOTAL_KEY] = Quantity(TOTAL_KEY, value, "sum", [current, other])
        b.order.append(TOTAL_KEY)
        pa, pb = current.partition("@")[0], other.partition("@")[0]
        question = f"How many {b.item} do {pa} and {pb} have together?"
        target = TOTAL_KEY
    else:
        suffix = " now" if "@" in current else ""
        question = f"How many {b.item} does {current.partition('@')[0]} have{suffix}?"
        target = current
    # Distractor sentences, inserted at random places after the sentences they refer to.
    n_distract = rng.randint(cfg.min_distractors, cfg.max_distractors)
    sentences = list(b.sentences)
    kinds = []
    for _ in range(n_distract):
        sentence, person, quantity = _distractor(b)
        mentions = [i for i, s in enumerate(sentences) if person is not None and re.search(rf"\b{person}\b", s)]
        if quantity is not None:
            # A relation to a person's count comes after every sentence about that person, so the
            # count it refers to is the person's final one.
            low = max(mentions) + 1
            b.quantities[quantity.key] = quantity
        else:
            low = min(mentions) + 1 if mentions else 0
        sentences.insert(rng.randint(low, len(sentences)), sentence)
        kinds.append(sentence)
    # Every quantity in the chain is needed; mark from the target down.
    stack = [target]
    while stack:
        key = stack.pop()
        q = b.quantities[key]
        if q.op is not None and not q.needed:
            q.needed = True
            stack.extend(a for a in q.args if isinstance(a, str))
    order = [k for k in b.order if b.quantities[k].needed]
    steps = []
    for key in order:
        q = b.quantities[key]
        assert q.op is not None  # only computed quantities are marked needed
        expr = f" {OP_SYMBOL[q.op]} ".join(str(b.value(a)) if isinstance(a, str) else str(a) for a in q.args)
        steps.append(step_text(key, expr, q.value, b.item))
    steps.append(answer_step(b.value(target)))
    return {
        "question": " ".join(sentences) + " " + question,
        "answer": str(b.value(target)),
        "steps": steps,
        "world": {
            "item": b.item,
            "target": target,
            "n_steps": len(order),
            "distractors": kinds,
            "quantities": {k: asdict(q) for k, q in b.quantities.items()},
        },
    }


SPLIT_BUCKETS = {"test": range(0, 10), "dev": range(10, 20), "train": range(20, 100)}
"""A problem belongs to the split owning hash(question) % 100: splits are disjoint by construction."""


def split_of(question: str) -> str:
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 100
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def world_config_of(policy_dir: str | Path | None) -> WorldConfig:
    """The world a policy was trained on (`world_config.json` that `rl.sft` saves), else the default.
    A policy folder without that file (a model trained outside `rl.sft`) gets the default world with
    a one-line note on stderr, since its problems may then differ from the ones it was taught on."""
    saved = Path(policy_dir) / "world_config.json" if policy_dir else None
    if saved is None or not saved.exists():
        if saved is not None and saved.parent.is_dir():
            print(f"note: {policy_dir} has no world_config.json (rl.sft writes it): world problems use the "
                  f"world's defaults (inverse phrasings {WorldConfig().p_inverse}); copy the file of the world "
                  "the policy was taught on into that folder to use it", file=sys.stderr)
        return WorldConfig()
    values: dict[str, Any] = json.loads(saved.read_text())
    if "ops" in values:
        values["ops"] = tuple(values["ops"])  # JSON has no tuples
    return WorldConfig(**values)


WORLD_FILES = ("world_config.json", "teacher.json")
"""What `rl.sft` writes beside a world policy's weights: its world, and the teacher that taught it."""


def taught_tasks(policy_dir: str | Path | None) -> list[str] | None:
    """The corpus tasks a world policy was taught (`reasoning.corpora.TASKS`: "solve", "revise", ...),
    as `rl.sft` records them in `teacher.json` (`tasks`; a policy trained before that field existed:
    `eval.json`'s `corpus_tasks`, tasks of weight > 0). None when unknown: no such folder (a Hub id,
    a served model), a model trained outside `rl.sft`, or files that do not say."""
    if not policy_dir or not Path(policy_dir).is_dir():
        return None
    for name, key in (("teacher.json", "tasks"), ("eval.json", "corpus_tasks")):
        path = Path(policy_dir) / name
        try:
            value = json.loads(path.read_text()).get(key) if path.is_file() else None
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, dict):
            value = [k for k, w in value.items() if isinstance(w, (int, float)) and w > 0]
        if isinstance(value, list) and all(isinstance(t, str) for t in value):
            return sorted(value)
    return None


def carry_world_files(source_policy: str | Path | None, target_dir: str | Path) -> list[str]:
    """Copy a policy's world files into a model trained from it (PPO, RFT), so that evaluating the
    new model on "its world" (`world_config_of`) reads the same problems. Returns the names copied."""
    import shutil

    if not source_policy or not Path(source_policy).is_dir():
        return []
    copied = []
    for name in WORLD_FILES:
        src = Path(source_policy) / name
        if src.is_file():
            Path(target_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, Path(target_dir) / name)
            copied.append(name)
    return copied


def generate(split: str, n: int, seed: int = 0, config: WorldConfig | None = None) -> list[dict[str, Any]]:
    """`n` distinct problems of `split` (train / dev / test) as rows of the benchmark schema."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"split must be one of {sorted(SPLIT_BUCKETS)}, got {split!r}")
    if n < 0:
        raise ValueError("n must be >= 0")
    cfg = config or WorldConfig()
    rng = random.Random(f"world-{seed}-{split}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 1000 * (n + 10):
            raise RuntimeError("the world config admits too few distinct problems for this split")
        row = _generate_one(rng, cfg)
        if row is None or row["question"] in seen or split_of(row["question"]) != split:
            continue
        seen.add(row["question"])
        row = {"id": f"world-{split}-{seed}-{len(rows)}", **row, "answer_kind": "number"}
        rows.append(row)
    return rows


def generate_problems(split: str, n: int, seed: int = 0, config: WorldConfig | None = None) -> list[Problem]:
    return [row_to_problem(r) for r in generate(split, n, seed, config)]


def row_to_problem(row: dict[str, Any]) -> Problem:
    meta = {k: v for k, v in row.items() if k not in ("id", "question", "answer", "answer_kind")}
    return Problem(id=row["id"], question=row["question"], answer=row["answer"], answer_kind="number", meta=meta)


def gold_solution(problem: Problem | dict[str, Any]) -> str:
    from reasoning.steps import join_steps

    steps = problem.meta["steps"] if isinstance(problem, Problem) else problem["steps"]
    return join_steps(steps)


# ---------------------------------------------------------------------------------------------
# Checking.


@dataclass
class StepCheck:
    ok: bool
    kind: str
    """'correct', 'propagated' (wrong only because an earlier step was) or one of ERROR_KINDS."""
    key: str | None = None
    claimed: str | None = None
    true: str | None = None
    naming_slip: bool = False
    """The step computes a quantity the solution needs, right, under another person's name."""


def _spec(problem: Problem | dict[str, Any]) -> dict[str, Any]:
    if isinstance(problem, Problem):
        return problem.meta["world"]
    return problem["world"] if "world" in problem else problem


MAX_NUMBER_DIGITS = 100
"""Numbers in model output longer than this are unparseable: the step is wrong ('format'), and
Python's limit on int conversion (4,300 digits) is never reached."""


def _number(text: str) -> Fraction | None:
    """A number written in model output as an exact Fraction; None when it has too many digits."""
    if sum(ch.isdigit() for ch in text) > MAX_NUMBER_DIGITS:
        return None
    return Fraction(text)


def _parse_binary(expr: str) -> tuple[Fraction, str, Fraction] | None:
    m = re.fullmatch(r"\s*(-?[0-9]+)\s*([-+*/])\s*(-?[0-9]+)\s*", expr)
    if not m:
        return None
    x, y = _number(m.group(1)), _number(m.group(3))
    return None if x is None or y is None else (x, m.group(2), y)


class _Reading:
    """What the solution needs, computed once per problem: each needed quantity's operation and
    true operand values, and the misread computations a weaker reader would write for it."""

    def __init__(self, quantities: dict[str, Any], true: dict[str, Fraction]):
        self.quantities = quantities
        self.true = true
        self.needed = [k for k, q in quantities.items() if q.get("needed") and q["op"] is not None
                       and len(q["args"]) == 2]

    def operands(self, key: str, values: dict[str, Fraction] | None = None) -> list[Fraction]:
        values = values or self.true
        return [values.get(a, self.true[a]) if isinstance(a, str) else Fraction(a)
                for a in self.quantities[key]["args"]]

    def computes(self, x: Fraction, sym: str, y: Fraction, result: Fraction, path: dict[str, Fraction]) -> str | None:
        """The needed quantity whose gold step this computation is (under any name) at this point of
        the path, or None: one the path has not computed yet, whose derived operands the path has
        already computed right (so '2 * 3' with a 3 the path never reached is not that step)."""
        for key in self.needed:
            if key in path or any(isinstance(a, str) and self.quantities[a]["op"] is not None
                                  and path.get(a) != self.true[a] for a in self.quantities[key]["args"]):
                continue
            if OP_SYMBOL[self.quantities[key]["op"]] == sym and _same(sym, [x, y], self.operands(key)) \
                    and result == self.true[key]:
                return key
        return None

    def carries(self, x: Fraction, sym: str, y: Fraction, path: dict[str, Fraction],
                first: str | None = None) -> str | None:
        """The needed quantity whose gold step this computation is on the values this path carries,
        at least one of them wrong, or None: one the path has not computed yet, every derived
        operand of which the path has computed (`first`, the name the step gives, is tried first).
        The step is wrong only because an earlier one was, whatever name it gives its result."""
        for key in sorted(self.needed, key=lambda k: k != first):
            q = self.quantities[key]
            derived = [a for a in q["args"] if isinstance(a, str) and self.quantities[a]["op"] is not None]
            if key in path or OP_SYMBOL[q["op"]] != sym or any(a not in path for a in derived) \
                    or all(path[a] == self.true[a] for a in derived):
                continue
            if _same(sym, [x, y], self.operands(key, path)):
                return key
        return None

    def misreading(self, x: Fraction, sym: str, y: Fraction, path: dict[str, Fraction], done: set[str],
                   only: str | None = None) -> str | None:
        """'misread_inverse' or 'misread_stale' when the computation is a taught misreading of a
        needed quantity (`only` that one) not among `done` (with the true operands or the ones this
        path carried)."""
        for key in self.needed:
            if key in done or (only is not None and key != only):
                continue
            q = self.quantities[key]
            inverse_op, _ = misread_relation(q, ("inverse",))
            _, stale_args = misread_relation(q, ("stale",))
            for values in (self.true, path):
                operands = self.operands(key, values)
                if inverse_op is not None and inverse_op != q["op"] and sym == OP_SYMBOL[inverse_op] \
                        and [x, y] == operands:
                    return "misread_inverse"
                # the stale reading's operands: the count before the event, the others as carried
                stale = [self.true[a] if a != b else v for a, b, v in zip(stale_args, q["args"], operands)]
                if stale != operands and sym == OP_SYMBOL[q["op"]] and _same(sym, [x, y], stale):
                    return "misread_stale"
        return None

    def overturned(self, x: Fraction, sym: str, y: Fraction, path: dict[str, Fraction], done: set[str]) -> str | None:
        """'misread_direct' when the computation is a needed, directly phrased relation (not among
        `done`, its derived operands already computed by this path) computed with the inverse
        operation on the operands this path carries. Used to name an error, never to judge a step."""
        for key in self.needed:
            q = self.quantities[key]
            if key in done or q.get("inverse") or q["op"] not in INVERSE_OP or any(
                    isinstance(a, str) and self.quantities[a]["op"] is not None and a not in path for a in q["args"]):
                continue
            if sym == OP_SYMBOL[INVERSE_OP[q["op"]]] and _same(sym, [x, y], self.operands(key, path)):
                return "misread_direct"
        return None


def _same(sym: str, got: list[Fraction], want: list[Fraction]) -> bool:
    return sorted(got) == sorted(want) if sym in "+*" else list(got) == list(want)


def check_steps(problem: Problem | dict[str, Any], steps: list[str], strict: bool = False,
                follow_carried: bool = False) -> list[StepCheck]:
    """A verdict for every step of a path, computed exactly from the problem's quantities.

    A computation step is correct when it parses, its arithmetic is right and it computes a
    quantity the solution needs: its operation is that quantity's and its operands are the true
    values of that quantity's operands (in either order for + and *), or its result is the true
    value of the quantity it names. The name a step attaches is checked apart: a right
    computation under another person's name is correct with `naming_slip` set. With `strict`, a
    step is correct only when its result is the true value of the quantity it names (the reading
    before names were checked apart). An answer step is correct when it states the target's true
    value. Wrong steps are classified by the kind of error.

    `follow_carried` changes only how wrong steps are classified, never which steps are right: a
    step that does a needed quantity's gold computation on the wrong values the path carries is
    `propagated` (with `naming_slip` set) under whatever name it gives its result, and the path
    carries its value as that quantity's. Without it, only a step that names that quantity is
    `propagated`; under another name the same step is an own error (`other`, `unknown_quantity`,
    `wrong_operand`, ...), and so is every later step that carries its value, each counted again.
    """
    spec = _spec(problem)
    quantities = spec["quantities"]
    true = {k: Fraction(q["value"]) for k, q in quantities.items()}
    target_value = true[spec["target"]]
    reading = _Reading(quantities, true)
    claimed_by_path: dict[str, Fraction] = {}
    out: list[StepCheck] = []
    for raw in steps:
        text = raw.strip()
        verdict: StepCheck
        if "<ans>" in text or re.search(r"answer is", text, re.IGNORECASE):
            m = _ANSWER_RE.search(text)
            value = _number(m.group(1)) if m else None
            if value is None:
                verdict = StepCheck(False, "format")
            elif value == target_value:
                verdict = StepCheck(True, "correct", spec["target"], _fmt(value), _fmt(target_value))
            else:
                kind = "propagated" if claimed_by_path.get(spec["target"]) == value else "wrong_answer"
                verdict = StepCheck(False, kind, spec["target"], _fmt(value), _fmt(target_value))
        else:
            verdict = _check_computation(text, quantities, true, claimed_by_path, reading, strict, follow_carried)
        out.append(verdict)
    return out


def _check_computation(text: str, quantities: dict[str, Any], true: dict[str, Fraction],
                       claimed_by_path: dict[str, Fraction], reading: _Reading, strict: bool,
                       follow_carried: bool = False) -> StepCheck:
    m = _STEP_RE.match(text)
    if not m:
        return StepCheck(False, "format")
    key = TOTAL_KEY if m.group("together") else m.group("who") + ("@now" if m.group("now") else "")
    claimed = _number(m.group("res"))
    if claimed is None:
        return StepCheck(False, "format", key)
    value = try_evaluate(m.group("expr"))
    if value is None:
        return StepCheck(False, "format", key, _fmt(claimed))
    parsed = _parse_binary(m.group("expr"))
    done = set(claimed_by_path)  # quantities the path computed before this step
    by_computation = not strict and parsed is not None  # else by the name and the result
    meant = None
    if parsed is not None and by_computation and value == claimed:
        meant = reading.computes(*parsed, claimed, claimed_by_path)
        if meant is not None and meant != key and key in quantities \
                and reading.misreading(*parsed, claimed_by_path, done, only=key):
            meant = None  # the misreading of the quantity it names, not another's step misnamed
    if meant is not None:  # a needed computation with the right operands, under whatever name
        claimed_by_path[meant] = claimed
        return StepCheck(True, "correct", meant, _fmt(claimed), _fmt(true[meant]), naming_slip=meant != key)
    before = dict(claimed_by_path) if follow_carried else claimed_by_path
    verdict = _judge_wrong(key, claimed, value, parsed, by_computation, quantities, true, claimed_by_path,
                           reading, done)
    if follow_carried and not verdict.ok and verdict.kind not in ("propagated", "slip", "format") \
            and parsed is not None and by_computation \
            and not (key in quantities and reading.misreading(*parsed, before, done, only=key)):
        carried = reading.carries(*parsed, before, first=key)
        if carried is not None and carried != key:  # another needed quantity's step on carried values, misnamed
            claimed_by_path[carried] = claimed
            return StepCheck(False, "propagated", carried, _fmt(claimed), _fmt(true[carried]), naming_slip=True)
    return verdict


def _judge_wrong(key: str, claimed: Fraction, value: Fraction, parsed: tuple[Fraction, str, Fraction] | None,
                 by_computation: bool, quantities: dict[str, Any], true: dict[str, Fraction],
                 claimed_by_path: dict[str, Fraction], reading: _Reading, done: set[str]) -> StepCheck:
    """The verdict on a computation step that is not a needed computation with the right operands."""
    if key in quantities:
        claimed_by_path[key] = claimed  # later steps may carry this value forward, right or wrong
    if value != claimed:
        return StepCheck(False, "slip", key, _fmt(claimed), _fmt(true[key]) if key in true else None)
    if not by_computation and key in quantities and claimed == true[key]:
        return StepCheck(True, "correct", key, _fmt(claimed), _fmt(true[key]))
    # wrong: a taught misreading, unless the step only carries an earlier error forward
    misread = (reading.misreading(*parsed, claimed_by_path, done)
               or reading.overturned(*parsed, claimed_by_path, done)) if parsed is not None else None
    if key not in quantities:
        return StepCheck(False, misread or "unknown_quantity", key, _fmt(claimed))
    return StepCheck(False, _wrong_kind(quantities[key], parsed, misread, true, claimed_by_path), key, _fmt(claimed),
                     _fmt(true[key]))


def _wrong_kind(q: dict[str, Any], parsed: tuple[Fraction, str, Fraction] | None, misread: str | None,
                true: dict[str, Fraction], claimed_by_path: dict[str, Fraction]) -> str:
    """Why a wrong step computing a known quantity `q` is wrong: `propagated` (the right computation
    on earlier wrong values), a taught misreading, `wrong_operand`, `wrong_operation`, else `other`."""
    if q["op"] is None or parsed is None or len(q["args"]) != 2:
        return misread or "other"
    x, sym, y = parsed
    gold_sym = OP_SYMBOL[q["op"]]
    gold_true = [true[a] if isinstance(a, str) else Fraction(a) for a in q["args"]]
    gold_path = [claimed_by_path.get(a, true[a]) if isinstance(a, str) else Fraction(a) for a in q["args"]]
    if sym == gold_sym and gold_path != gold_true and _same(sym, [x, y], gold_path):
        return "propagated"
    if misread:
        return misread
    if sym == gold_sym:
        return "wrong_operand"
    if sorted([x, y]) in (sorted(gold_true), sorted(gold_path)):
        return "wrong_operation"
    return "other"


def earliest_error(problem: Problem | dict[str, Any], steps: list[str], strict: bool = False) -> int:
    """Index of the first wrong step; -1 when every step is right and the last states the right answer.

    A path whose steps are all right but which never states an answer gets index len(steps).
    `strict`: names count (see `check_steps`).
    """
    checks = check_steps(problem, steps, strict)
    for i, c in enumerate(checks):
        if not c.ok:
            return i
    if not steps or not _ANSWER_RE.search(steps[-1]):
        return len(steps)
    return -1


def error_kind(problem: Problem | dict[str, Any], steps: list[str], strict: bool = False) -> str | None:
    """The kind of the earliest error ('missing_answer' for a path that stops without one), or None."""
    checks = check_steps(problem, steps, strict)
    for c in checks:
        if not c.ok:
            return c.kind
    if not steps or not _ANSWER_RE.search(steps[-1]):
        return "missing_answer"
    return None


# ---------------------------------------------------------------------------------------------
# Corruption: paths with one injected error at a known step, carried forward consistently.


CORRUPTIONS = ("slip", "wrong_operand", "wrong_operation")


def corrupt_steps(
    problem: Problem | dict[str, Any], rng: random.Random, at: int | None = None, kind: str | None = None
) -> tuple[list[str], int, str]:
    """A path with an error injected at computation step `at` (random if None), later steps
    recomputed from the wrong value. Returns (steps, index of the injected error, kind)."""
    spec = _spec(problem)
    quantities = spec["quantities"]
    order = [k for k in _solution_order(problem)]
    if not order:
        raise ValueError("problem has no computation step to corrupt")
    for _ in range(50):
        i = rng.randrange(len(order)) if at is None else at
        k = kind or rng.choice(CORRUPTIONS)
        made = _try_corrupt(spec, quantities, order, i, k, rng)
        if made is not None:
            return made, i, k
    raise ValueError(f"could not corrupt step {at} of this problem")


def _solution_order(problem: Problem | dict[str, Any]) -> list[str]:
    spec = _spec(problem)
    steps = problem.meta["steps"] if isinstance(problem, Problem) else problem["steps"]
    order = []
    for s in steps[:-1]:
        m = _STEP_RE.match(s)
        if m is None:
            raise ValueError(f"not a computation step of the world's gold solution: {s!r}")
        order.append(TOTAL_KEY if m.group("together") else m.group("who") + ("@now" if m.group("now") else ""))
    assert all(k in spec["quantities"] for k in order)
    return order


def _try_corrupt(spec: dict[str, Any], quantities: dict[str, Any], order: list[str], i: int, kind: str,
                 rng: random.Random) -> list[str] | None:
    item = spec["item"]
    values = {k: Fraction(q["value"]) for k, q in quantities.items()}
    steps = []
    for j, key in enumerate(order):
        q = quantities[key]
        operands = [values[a] if isinstance(a, str) else Fraction(a) for a in q["args"]]
        sym = OP_SYMBOL[q["op"]]
        if j == i:
            if kind == "wrong_operation":
                sym = rng.choice([s for s in "+-*/" if s != sym])
            elif kind == "wrong_operand":
                pool = {Fraction(v["value"]) for k, v in quantities.items() if k != key} | {
                    Fraction(n) for n in re.findall(r"\b[0-9]+\b", " ".join(spec.get("distractors", [])))
                }
                pool -= set(operands)
                if not pool:
                    return None
                operands[rng.randrange(2)] = rng.choice(sorted(pool))
        value = _apply(operands[0], sym, operands[1])
        if value is None or value.denominator != 1 or value < 0 or value > 10 * 999:
            return None
        if j == i and kind == "slip":
            value += rng.choice([-10, -2, -1, 1, 2, 10])
            if value < 0:
                return None
        if j == i and value == Fraction(q["value"]):
            return None  # not an error after all
        values[key] = value
        expr = f" {sym} ".join(_fmt(o) for o in operands)
        steps.append(step_text(key, expr, _fmt(value), item))
    steps.append(answer_step(_fmt(values[spec["target"]])))
    return steps


# ---------------------------------------------------------------------------------------------
# A weaker teacher: solutions that take the plausible wrong reading of a decision, consistently.


def misread_relation(q: dict[str, Any], misread: Collection[str]) -> tuple[str | None, list[Any]]:
    """A quantity's operation and operands as a reader who misreads the given kinds writes them:
    `inverse` swaps the operation of an inversely phrased relation (add <-> sub, mul <-> div);
    `stale` takes a person's count before their event ('Hal@now' -> 'Hal') in a relation."""
    op, operands = q["op"], list(q["args"])
    if "inverse" in misread and q.get("inverse") and op in INVERSE_OP:
        op = INVERSE_OP[op]
    if "stale" in misread and op in RELATION_OPS:
        operands = [a.partition("@")[0] if isinstance(a, str) and a.endswith("@now") else a for a in operands]
    return op, operands


def misreadings_of(problem: Problem | dict[str, Any]) -> list[str]:
    """The kinds in MISREADINGS that a teacher could get wrong in this problem's solution."""
    return [kind for kind in MISREADINGS if teacher_solution(problem, (kind,)) is not None]


def teacher_solution(problem: Problem | dict[str, Any], misread: Collection[str],
                     max_value: int = 999) -> list[str] | None:
    """The solution of a teacher who misreads the given kinds of decision, carried consistently to
    its answer: `inverse`, every inversely phrased relation computed with the operation its words
    name ('Ava has 3 fewer than Ben' as Ben = Ava - 3); `stale`, a person's count before an event
    used in every relation stated after it. None when the problem has no such decision the
    solution needs, or the misreading leads to a count that is not a whole number in
    [1, max_value] (a teacher would notice that)."""
    unknown = set(misread) - set(MISREADINGS)
    if unknown:
        raise ValueError(f"unknown misreadings {sorted(unknown)}; choose from {MISREADINGS}")
    spec = _spec(problem)
    quantities = spec["quantities"]
    ops: dict[str, str | None] = {}
    args: dict[str, list[Any]] = {}
    for key, q in quantities.items():
        ops[key], args[key] = misread_relation(q, misread)
    needed, stack = set(), [spec["target"]]
    while stack:
        key = stack.pop()
        if ops[key] is not None and key not in needed:
            needed.add(key)
            stack.extend(a for a in args[key] if isinstance(a, str))
    changed = any(ops[k] != quantities[k]["op"] or args[k] != quantities[k]["args"] for k in needed)
    if not changed:
        return None
    values: dict[str, Fraction] = {k: Fraction(q["value"]) for k, q in quantities.items() if q["op"] is None}
    steps = []
    for key in _solution_order(problem):
        if key not in needed:
            continue
        operands = [values[a] if isinstance(a, str) else Fraction(a) for a in args[key]]
        op = ops[key]
        assert op is not None  # `needed` holds only computed quantities
        sym = OP_SYMBOL[op]
        value = _apply(operands[0], sym, operands[1])
        if value is None or value.denominator != 1 or not 1 <= value <= max_value:
            return None
        values[key] = value
        steps.append(step_text(key, f" {sym} ".join(_fmt(o) for o in operands), _fmt(value), spec["item"]))
    steps.append(answer_step(_fmt(values[spec["target"]])))
    return steps


def _apply(a: Fraction, sym: str, b: Fraction) -> Fraction | None:
    if sym == "+":
        return a + b
    if sym == "-":
        return a - b
    if sym == "*":
        return a * b
    return a / b if b != 0 else None


# ---------------------------------------------------------------------------------------------
# CLI.


def config_from_args(values: dict[str, Any]) -> WorldConfig:
    known = {f.name for f in fields(WorldConfig)}
    return WorldConfig(**{k: v for k, v in values.items() if k in known and v is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reasoning.world", description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test", choices=sorted(SPLIT_BUCKETS))
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSONL file to write")
    for f in fields(WorldConfig):
        if f.name == "ops":
            parser.add_argument("--ops", nargs="+", default=None)
        else:
            parser.add_argument(f"--{f.name}", type=type(f.default), default=None)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(vars(args))
        rows = generate(args.split, args.n, args.seed, cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    steps = [r["world"]["n_steps"] for r in rows]
    print(json.dumps({"out": str(out), "n": len(rows), "split": args.split, "seed": args.seed,
                      "mean_steps": sum(steps) / max(len(steps), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
