"""`exact-noisy`: the world's exact step checker with *systematic* errors, a PRM quality axis.

A learned PRM is not wrong at random: it misjudges certain steps, and it misjudges them the same way
every time it sees them, so a policy trained on its scores can learn to write them. This verifier
is the exact checker (`reward_models.exact`) with errors of that sort:

- `accept=A`: a wrong step whose error kind is among `kinds` is judged right (a false accept, what
  a policy exploits) when its draw u < A;
- `reject=R`: a right step is judged wrong (a false reject) when its draw u < R;
- `kinds=K+K...`: the error kinds of `reasoning.world.ERROR_KINDS` that false accepts touch
  (default: all of them); `seed=S` (default 0): which steps those are.

The draw u in [0, 1) of a step is a hash of (seed, question, the step's text stripped): the same
step text under the same question gets the same verdict on every call, in every batch, on every
path. There is no random state. A `propagated` step (wrong only because it carries an earlier wrong
value forward) follows the earlier verdict: it is reached with its path still judged right only
when every earlier wrong step was falsely accepted, so the verifier, which believed that value, also
believes what is computed from it. As `exact`, a path's scores are 1.0 up to its first step judged
wrong and 0.0 from there on; with A = R = 0 they equal `exact`'s.

Spec: `exact-noisy:accept=0.3/kinds=misread_inverse+misread_stale/reject=0.05/seed=0` (fields
joined by `/`, so the spec stays one part of `product:` and `min:` combinations, which split on
commas). Measure the F1 of a level with `python -m reward_models.verifier_metrics --verifier SPEC --data
world --policy P`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from reasoning.world import ERROR_KINDS, check_steps
from reward_models.verifier import UnknownQuestionError, validate_paths

NAME = "exact-noisy"
FIELDS = ("accept", "reject", "kinds", "seed")


@dataclass(frozen=True)
class NoiseSpec:
    accept: float = 0.0
    """Share of wrong steps of `kinds` judged right."""
    reject: float = 0.0
    """Share of right steps judged wrong."""
    kinds: tuple[str, ...] = ERROR_KINDS
    """Error kinds false accepts touch."""
    seed: int = 0


def _spec_fields(rest: str, usage: str) -> dict[str, str]:
    """The key=value fields of a spec, each a known field given once."""
    values: dict[str, str] = {}
    for field_text in rest.split("/"):
        key, sep, value = field_text.strip().partition("=")
        if not sep or not key or not value:
            raise ValueError(f"verifier {NAME}:{rest}: {field_text!r} is not key=value; spec: {usage}")
        if key not in FIELDS:
            raise ValueError(f"verifier {NAME}:{rest}: unknown field {key!r} (fields: {', '.join(FIELDS)})")
        if key in values:
            raise ValueError(f"verifier {NAME}:{rest}: {key} given twice")
        values[key] = value.strip()
    return values


def _shares(rest: str, values: dict[str, str]) -> dict[str, float]:
    """The accept and reject shares given, each a number in [0, 1]."""
    shares = {}
    for key in ("accept", "reject"):
        if key in values:
            try:
                shares[key] = float(values[key])
            except ValueError:
                raise ValueError(f"verifier {NAME}:{rest}: {key}={values[key]!r} is not a number") from None
            if not 0.0 <= shares[key] <= 1.0:
                raise ValueError(f"verifier {NAME}:{rest}: {key}={values[key]} is outside [0, 1]")
    return shares


def parse_noise_spec(rest: str | None) -> NoiseSpec:
    """The NoiseSpec of `exact-noisy:REST`; ValueError saying what is wrong and what is allowed."""
    usage = (f"{NAME}:accept=A/reject=R/kinds=K+K/seed=S (A, R in [0, 1]; kinds from "
             f"{', '.join(ERROR_KINDS)}; at least accept or reject)")
    if not rest or not rest.strip():
        raise ValueError(f"verifier {NAME}: name its errors, e.g. {NAME}:accept=0.3/kinds=misread_inverse; "
                         f"spec: {usage}")
    values = _spec_fields(rest, usage)
    shares = _shares(rest, values)
    if not shares:
        raise ValueError(f"verifier {NAME}:{rest}: give accept= or reject= (else it is `exact`); spec: {usage}")
    kinds = ERROR_KINDS
    if "kinds" in values:
        kinds = tuple(k.strip() for k in values["kinds"].split("+"))
        unknown = [k for k in kinds if k not in ERROR_KINDS]
        if unknown or not all(kinds):
            raise ValueError(f"verifier {NAME}:{rest}: unknown error kind(s) {', '.join(unknown) or repr('')} "
                             f"(kinds: {', '.join(ERROR_KINDS)}, joined by +)")
        if "accept" not in shares:
            raise ValueError(f"verifier {NAME}:{rest}: kinds= chooses the steps false accepts touch: give accept=")
    seed = 0
    if "seed" in values:
        try:
            seed = int(values["seed"])
        except ValueError:
            raise ValueError(f"verifier {NAME}:{rest}: seed={values['seed']!r} is not an integer") from None
    return NoiseSpec(shares.get("accept", 0.0), shares.get("reject", 0.0), kinds, seed)


def step_draw(question: str, step: str, seed: int = 0) -> float:
    """The step's fixed draw in [0, 1): its verdict flips when the draw is below the share."""
    key = f"{seed}\x1f{question}\x1f{step.strip()}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2 ** 64


class SystematicExactVerifier:
    def __init__(self, problems_by_question: dict[str, dict], noise: NoiseSpec):
        """`problems_by_question` maps a question text to its world row (with the `world` field)."""
        self.problems = problems_by_question
        self.noise = noise
        self.tokens_used = 0

    @classmethod
    def from_rows(cls, rows: Sequence[dict], noise: NoiseSpec) -> SystematicExactVerifier:
        return cls({r["question"]: r for r in rows}, noise)

    def judged_right(self, question: str, steps: Sequence[str]) -> list[bool]:
        """Each step's verdict as this verifier sees it, up to and including its first step judged wrong."""
        row = self.problems.get(question)
        if row is None:
            raise KeyError("the exact-noisy verifier knows only world problems; question not found")
        noise = self.noise
        verdicts = []
        for step, check in zip(steps, check_steps(row, list(steps))):
            u = step_draw(question, step, noise.seed)
            if check.ok:
                right = not u < noise.reject
            elif check.kind == "propagated":
                right = True  # reached only when every earlier wrong step was falsely accepted
            else:
                right = check.kind in noise.kinds and u < noise.accept
            verdicts.append(right)
            if not right:
                break
        return verdicts

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        out = []
        for i, (question, steps) in enumerate(zip(questions, paths)):
            try:
                verdicts = self.judged_right(question, steps)
            except KeyError:
                raise UnknownQuestionError(f"row {i}: the exact-noisy verifier knows only world problems; "
                                           "question not found") from None
            first_wrong = verdicts.index(False) if False in verdicts else len(steps)
            out.append([1.0 if k < first_wrong else 0.0 for k in range(len(steps))])
        return out


def load(rest: str | None, world_rows: Sequence[dict] | None) -> SystematicExactVerifier:
    """The verifier of `exact-noisy:REST` over the world rows (rows with a `world` field)."""
    noise = parse_noise_spec(rest)
    rows = [r for r in (world_rows or []) if isinstance(r, dict) and "world" in r]
    if not rows:
        raise ValueError(f"the {NAME} verifier checks world problems only: evaluate on world data")
    return SystematicExactVerifier.from_rows(rows, noise)


__all__ = ["NAME", "NoiseSpec", "SystematicExactVerifier", "load", "parse_noise_spec", "step_draw"]
