"""Reward functions in TRL's `reward_funcs` shape, and the one place `--reward` becomes them.

A reward function is called as TRL's `GRPOTrainer` calls one,

    func(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list

with one entry per completion, and keyword columns for the rest: `question`, `answer` and `id`
(the dataset's columns, as TRL passes them), `problems` (the `reasoning.types.Problem` of each
completion) and `steps` (each completion split into its reasoning steps). Take what you need and
end with `**kwargs`. An entry is

- a float: a per-sequence reward, paid at the completion's last token;
- a list with one entry per step (`steps[i]`): per-step rewards, each paid at the token that ends
  its step; a `None` in the list pays nothing at that step and leaves it out of the group
  normalisation (min-form credit pays one step only);
- `None`: the function has nothing to say about this completion (nothing is paid).

A function is per-step when it sets `per_step = True` (only then may it return lists). The
trainer multiplies each function's output by its weight and adds them up where they land, so
`step`, `outcome`, `gold`, `step+gold`, the format penalties and a user's own function are the same
kind of thing: `StepPPOTrainer(..., reward_funcs=[...], reward_weights=[...])`, or on the command
line `--reward_funcs my_rewards.py:brevity --reward_weights 0.1` beside the built-in `--reward`.
A TRL reward function (per-sequence, returning floats) works unchanged, and `answer_check` is one
that TRL's `GRPOTrainer` takes (`rl/baselines/grpo_peer.py` uses it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasoning.steps import answer_correct, has_answer
from reasoning.types import Problem
from reward_models.scoring import score_paths
from reward_models.verifier import aggregate
from rl.ppo_math import ESTIMATORS
from rl.step_rewards import credited_steps, shape_step_rewards

__all__ = [
    "REWARDS",
    "RewardMode",
    "ScoredRewards",
    "VerifierOutcomeReward",
    "VerifierStepReward",
    "WeightedReward",
    "answer_check",
    "build_reward_funcs",
    "call_reward_func",
    "load_reward_func",
    "missing_eos",
    "no_answer",
]

RewardOutput = float | list[float | None] | None


@dataclass(frozen=True)
class RewardMode:
    """What a `--reward` pays: the one place a reward's name is resolved."""

    verifier: bool
    """Reads the verifier's step scores (a verifier is loaded)."""
    steps: bool
    """Pays each step's score at the token ending it; False: the verifier's whole-path score (if
    any) at the last token."""
    gold: bool
    """Pays the answer's correctness (1 right, 0 wrong, times gold_reward_weight) at the last token."""
    progress: bool = False
    """Pays each step its progress under a prover (PAV, `rl.progress`: the change in the prover's
    chance of a right answer across the step, times --progress_coef) at the token ending it; the
    prover's continuations are sampled after the other rewards (`RolloutSampler.progress_rewards`)."""

    @property
    def pays_last_token(self) -> bool:
        """Something is always paid at the last token (an outcome, a gold reward)."""
        return not (self.steps or self.progress) or self.gold


REWARDS = {
    "step": RewardMode(verifier=True, steps=True, gold=False),
    "outcome": RewardMode(verifier=True, steps=False, gold=False),
    "gold": RewardMode(verifier=False, steps=False, gold=True),
    "step+gold": RewardMode(verifier=True, steps=True, gold=True),
    "progress": RewardMode(verifier=False, steps=False, gold=False, progress=True),
    "gold+progress": RewardMode(verifier=False, steps=False, gold=True, progress=True),
}


def _problems(problems: Sequence[Problem] | None, answer: Sequence[str] | None) -> list[Problem]:
    if problems is not None:
        return list(problems)
    if answer is None:
        raise TypeError("answer_check needs the `answer` column (or `problems`)")
    return [Problem(id="", question="", answer=str(a)) for a in answer]


def answer_check(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str] | None = None,
                 problems: Sequence[Problem] | None = None, answer_match: str = "strict", **_: Any) -> list[float]:
    """1.0 where the completion's answer is the gold answer, else 0.0 (`reasoning.steps.answer_correct`
    under the answer check `answer_match`; "strict", the default, counts only a stated answer): the
    gold reward. Grades by the `problems` when given (answer kinds, options), else by the `answer`
    column, so TRL's `GRPOTrainer` can call it on a dataset with an `answer` column."""
    return [float(answer_correct(c, p, answer_match)) for c, p in zip(completions, _problems(problems, answer))]


answer_check.__name__ = "gold"


def missing_eos(prompts: Sequence[str], completions: Sequence[str], completion_ids: Sequence[Sequence[int]],
                eos_token_id: int | None = None, **_: Any) -> list[float | None]:
    """-1.0 for a completion cut off before its end-of-sequence token (truncated), else None."""
    return [None if ids and ids[-1] == eos_token_id else -1.0 for ids in completion_ids]


def no_answer(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float | None]:
    """-1.0 for a completion that states no final answer (`has_answer`), else None."""
    return [None if has_answer(c) else -1.0 for c in completions]


class ScoredRewards(list):
    """A verifier reward's outputs, one per completion (a list: TRL's `reward_funcs` shape), returned
    with what lies behind them as values of the call: `scores`, the verifier's raw step scores of
    each path (None where not scored), and `unscorable`, how many paths it could not score. The
    trainer's reward table reads them from the outputs (`rl.reward_table.RewardTally`)."""

    def __init__(self, rewards: Sequence[RewardOutput], scores: list[list[float] | None], unscorable: int):
        super().__init__(rewards)
        self.scores = scores
        self.unscorable = unscorable


class VerifierStepReward:
    """Each step's verifier score, shaped (`rl.step_rewards.shape_step_rewards`), paid at its step's
    end: `--reward step`. A path the verifier cannot score (`reward_models.scoring`: no steps, an
    empty step, longer than its context) gets None and is counted in the outputs' `unscorable`
    (`ScoredRewards`)."""

    per_step = True
    uses_verifier = True
    __name__ = "verifier_steps"

    def __init__(self, verifier, shaping: str = "raw"):
        self.verifier, self.shaping = verifier, shaping

    def __call__(self, prompts, completions, question: Sequence[str], steps: Sequence[list[str]], **_
                 ) -> ScoredRewards:
        scores, unscorable = _scores(self.verifier, question, steps)
        out: list[RewardOutput] = []
        for s in scores:
            if s is None:
                out.append(None)
                continue
            shaped = shape_step_rewards(s, self.shaping)
            credited = set(credited_steps(s, self.shaping))
            out.append([r if k in credited else None for k, r in enumerate(shaped)])
        return ScoredRewards(out, scores, unscorable)


class VerifierOutcomeReward:
    """The verifier's whole-path score (`aggregation` of its step scores, shaped as a one-step path)
    at the last token: `--reward outcome`."""

    per_step = False
    uses_verifier = True
    __name__ = "verifier_outcome"

    def __init__(self, verifier, aggregation: str = "mean", shaping: str = "raw"):
        self.verifier, self.aggregation, self.shaping = verifier, aggregation, shaping

    def __call__(self, prompts, completions, question: Sequence[str], steps: Sequence[list[str]], **_
                 ) -> ScoredRewards:
        scores, unscorable = _scores(self.verifier, question, steps)
        return ScoredRewards([None if s is None else shape_step_rewards([aggregate(s, self.aggregation)],
                                                                         self.shaping)[0] for s in scores],
                             scores, unscorable)


def _scores(verifier, questions: Sequence[str], steps: Sequence[list[str]],
            ) -> tuple[list[list[float] | None], int]:
    """Every path's step scores in one batched call (None for an unscorable path), and how many
    were unscorable."""
    scored = score_paths(verifier, questions, steps)
    return scored.scores, scored.unscorable


@dataclass
class WeightedReward:
    """A reward function and its weight, under the name its metrics are logged with."""

    func: Callable[..., list]
    weight: float = 1.0
    name: str = ""
    kind: str = "user"
    """'verifier', 'gold', 'penalty' or 'user': which of the logged totals it adds to."""

    def __post_init__(self):
        if not self.name:
            self.name = getattr(self.func, "__name__", type(self.func).__name__)

    @property
    def per_step(self) -> bool:
        return bool(getattr(self.func, "per_step", False))


def build_reward_funcs(config, verifier, extra: Sequence[Callable] = (), extra_weights: Sequence[float] | None = None,
                       ) -> list[WeightedReward]:
    """The reward functions of a run: `config.reward` (REWARDS) read here and nowhere else (its gold
    reward under `config.answer_match`), the format penalties, the config's `--reward_funcs` (weights
    `--reward_weights`), then `extra` (a caller's functions, weights `extra_weights`); a user function's
    weight defaults to 1."""
    mode = REWARDS[config.reward]
    funcs: list[WeightedReward] = []
    if mode.verifier:
        if mode.steps:
            funcs.append(WeightedReward(VerifierStepReward(verifier, config.reward_shaping), config.step_reward_weight,
                                        kind="verifier"))
        else:
            funcs.append(WeightedReward(VerifierOutcomeReward(verifier, config.outcome_aggregation,
                                                              config.reward_shaping),
                                        config.step_reward_weight, kind="verifier"))
    if mode.gold:
        gold = functools.partial(answer_check, answer_match=config.answer_match)
        funcs.append(WeightedReward(gold, config.gold_reward_weight, name="gold", kind="gold"))
    if config.missing_eos_penalty:
        funcs.append(WeightedReward(missing_eos, config.missing_eos_penalty, kind="penalty"))
    if config.no_answer_penalty:
        funcs.append(WeightedReward(no_answer, config.no_answer_penalty, kind="penalty"))
    specs = list(config.reward_funcs or [])
    user = [(load_reward_func(spec), w) for spec, w in zip(specs, config.reward_weights or [1.0] * len(specs))]
    extra = list(extra)
    weights = [1.0] * len(extra) if extra_weights is None else [float(w) for w in extra_weights]
    if len(weights) != len(extra):
        raise ValueError(f"{len(extra)} reward functions but {len(weights)} reward weights")
    check_no_added_rewards(config.advantage_estimator, len(extra))
    for func, weight in [*user, *zip(extra, weights)]:
        if not callable(func):
            raise TypeError(f"a reward function must be callable, got {func!r}")
        funcs.append(WeightedReward(func, float(weight)))
    return funcs


def check_no_added_rewards(estimator: str, added: int, what: str = "reward functions") -> None:
    """ValueError when reward functions are added to --advantage_estimator mc_values, whose values
    are the answer check's alone (the flag's `--reward_funcs` and the trainer's `reward_funcs=`)."""
    if added and ESTIMATORS[estimator].monte_carlo:
        raise ValueError("--advantage_estimator mc_values values its continuations by the answer check alone: "
                         f"it cannot add {what}")


@functools.cache
def load_reward_func(spec: str) -> Callable[..., list]:
    """`path/to/file.py:name`, `package.module:name` or `package.module.name` (TRL's grpo script
    form) to the function it names (a class is instantiated): the user's own reward, run as their
    code. Errors name the spec. Loaded once per spec (the input checks and the trainer share it)."""
    where, sep, name = spec.rpartition(":")
    if not sep:  # TRL's grpo script form: a dotted path, package.module.function
        where, sep, name = spec.rpartition(".")
    if not sep or not where or not name:
        raise ValueError(f"--reward_funcs {spec}: expected FILE.py:FUNCTION, MODULE:FUNCTION or MODULE.FUNCTION")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"--reward_funcs {spec}: no such file {where}")
        module_name = f"_steprl_reward_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"--reward_funcs {spec}: {where} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # the user's file: any error in it is theirs to see, in one line
            raise ValueError(f"--reward_funcs {spec}: {where} failed to load: {type(err).__name__}: {err}") from err
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise ValueError(f"--reward_funcs {spec}: cannot import {where} ({err})") from err
    func = getattr(module, name, None)
    if func is None:
        raise ValueError(f"--reward_funcs {spec}: {where} has no {name!r}")
    if inspect.isclass(func):
        func = func()
    if not callable(func):
        raise ValueError(f"--reward_funcs {spec}: {name!r} is not callable")
    return func


def call_reward_func(reward: WeightedReward, prompts: list[str], completions: list[str],
                     completion_ids: list[list[int]], columns: dict[str, Any]) -> list[RewardOutput]:
    """One reward function's outputs on a batch, checked: one entry per completion, lists only from
    a per-step function (a verifier's `ScoredRewards` kept as it is, with its scores). Errors name the function."""
    out = reward.func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    out = out if isinstance(out, ScoredRewards) else list(out)
    if len(out) != len(completions):
        raise ValueError(f"reward function {reward.name!r} returned {len(out)} rewards for {len(completions)} "
                         "completions")
    for value in out:
        if isinstance(value, (list, tuple)) and not reward.per_step:
            raise ValueError(f"reward function {reward.name!r} returned a list (per-step rewards) but does not set "
                             "per_step = True")
    return out
