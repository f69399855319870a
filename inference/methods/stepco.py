"""StepCo: verify a reasoning path step by step, revise it from its first rejected step, repeat.

Wu et al. 2024, "Enhancing Mathematical Reasoning in LLMs by Stepwise Correction". The policy
writes a path in `<Step>` tags (greedy by default). Then, for up to `max_rounds` rounds
(the paper's T):

1. **Verify.** The process-supervised verifier gives every step a probability p_i that the path so
   far leads to the correct answer (`Verifier.score`, one forward pass per path).
2. **Stop** when every step reaches the threshold θ (p_i >= θ).
3. **Revise.** Otherwise take k, the first step with p_k < θ. Steps 1..k-1 are kept *verbatim*
   (spliced back by this code, never trusted to the model's copy) and steps k.. are regenerated:
   - `revision="prompt"` (the paper): `reasoning.prompts.revise_prompt` shows the path and the
     feedback "the probability that step k leads to the correct answer is p_k ... revise steps k
     onward while keeping steps 1 to k-1", and ends with the kept steps, so the model's
     completion is the new steps k..;
   - `revision="resample"`: the plain `solve_prompt` continued from the kept steps, sampled at
     `resample_temperature` (no feedback text; what a policy never trained on revision can do).
   - `revision="auto"` (the default): chosen by the evaluation harness before anything loads
     (`inference.chosen_settings`): `prompt` for a policy taught the revise format (`rl.sft --tasks
     ...,revise=W`, recorded in its `teacher.json`), else `resample`.

θ's default, None (`--threshold auto`), is also chosen by the harness: calibrated on held-apart
problems as `reward_models.verifier_metrics --calibrate-on` calibrates it, and kept only when StepCo at it
beats its own first paths there; otherwise 0 (never revise). `run` itself takes only chosen values.

The revision index never moves backwards: a later round whose first failing step lies inside the
kept prefix (possible only with a verifier whose step scores depend on later steps) is clamped to
the current index, so a kept prefix stays kept. The prediction is the final answer of the last
path. All problems' revisions of a round go to the generator in one call and their verification
in one `score` call.

Trace (`MethodOutput.trace`): `rounds`, one entry per path, each `{round, steps, scores,
revised_index, prompt_tokens, completion_tokens, verifier_tokens}` (`revised_index` is the
1-based step from which this path was regenerated, None for the initial path; `scores` None when
the path was not verified; the tokens are those of the generation that wrote the path and of its
verification, so the rounds' tokens add up to the problem's usage); `stopped` (`accepted`,
`max_rounds`, `unverifiable`: the path has no steps, `unscorable`: the verifier refused it);
`revisions`.

Flags: every generation's anomalies (`inference.methods.base.completion_flags`: truncated,
no_steps, no_answer, unclosed_tags, ...), plus `revision_unusable` (a revision with no steps: the
previous path and its scores are kept and the next round tries again), `unverifiable` and
`unscorable`.

`verify_and_revise` is the loop itself, shared with the PathCo ablation (`pathco.py`), which
differs only in the rule choosing where to revise from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backends.base import SamplingParams
from inference.methods.base import MethodOutput, Tracker, check_sampling_fields, completion_flags
from reasoning.answers import extract_answer
from reasoning.prompts import revise_prompt, solve_prompt
from reasoning.steps import prefix_text, split_steps
from reasoning.types import Problem

REVISIONS = ("prompt", "resample")
AUTO = "auto"
"""The `revision` (and, on the command line, `threshold`) left to `inference.chosen_settings`."""


@dataclass
class RevisionConfig:
    """The settings of the verify-then-revise loop (`verify_and_revise`), shared by StepCo's and
    PathCo's `Config`."""

    threshold: float | None = 0.5
    """θ: a step (StepCo) or a path's aggregate score (PathCo) is accepted when it is at least this (None:
    left to the harness, StepCo's default)."""
    max_rounds: int = 5
    """T: the most verify-then-revise rounds (revisions) per problem."""
    revision: str = AUTO
    """How the rejected part is regenerated: 'prompt' (StepCo's feedback prompt; needs a policy taught the
    revise format), 'resample' (StepCo: continue the kept steps; PathCo: a fresh sample) or 'auto'
    (the harness picks 'prompt' for a policy whose teacher.json lists the revise task, else 'resample')."""
    temperature: float = 0.0
    """Temperature of the initial path and of 'prompt' revisions (0: greedy)."""
    resample_temperature: float = 0.8
    """Temperature of 'resample' revisions (greedy would only repeat the rejected steps)."""
    top_p: float = 1.0
    """Nucleus sampling mass when sampling."""
    verify_final: bool = True
    """Also verify the path the last allowed revision produced, so every path in the trace has
    scores; False follows a strict verify-then-revise loop and saves one verifier pass."""
    max_new_tokens: int = 192
    """Most tokens generated for the initial path and for each revision."""
    seed: int = 0
    """Sampling seed; round r uses seed + r."""

    def __post_init__(self) -> None:
        check_loop_config(self)


@dataclass
class Config(RevisionConfig):
    """StepCo's settings: the loop's, with θ applied to each step's score."""

    threshold: float | None = field(default=None, metadata={"auto": True})
    """θ: a step is accepted when its score is at least this. None ('auto', the default): the harness
    calibrates θ on held-apart problems (the world's dev split) and keeps it only when StepCo at it beats
    its first paths there, else 0 (never revise)."""


def check_loop_config(config: RevisionConfig) -> None:
    check_sampling_fields(config)
    if config.revision not in (AUTO, *REVISIONS):
        raise ValueError(f"revision must be one of {(AUTO, *REVISIONS)}, got {config.revision!r}")
    if config.max_rounds < 0:
        raise ValueError(f"max_rounds must be >= 0, got {config.max_rounds}")
    if config.threshold is not None and not 0.0 <= config.threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {config.threshold}")


def unresolved(config: RevisionConfig) -> list[str]:
    """The settings still left to the harness ('auto'): what `run` cannot start with."""
    return ([f"revision={AUTO}"] if config.revision == AUTO else []) + \
        (["threshold=auto"] if config.threshold is None else [])


Choose = Callable[[list[float], int], "tuple[int, float] | None"]
"""Where to revise a verified path: (scores, current revision index) -> (1-based index k, the
probability to report in the feedback), or None to accept the path."""


def first_rejected(scores: list[float], threshold: float, floor: int = 1) -> tuple[int, float] | None:
    """StepCo's rule: the first step scored below `threshold` (1-based) and its score, clamped to
    be at least `floor` (the current revision index); None when every step reaches the threshold."""
    for j, score in enumerate(scores):
        if score < threshold:
            k = min(max(j + 1, floor), len(scores))
            return k, scores[k - 1]
    return None


@dataclass
class _State:
    steps: list[str]
    text: str
    """The path as text: the kept steps re-rendered plus the latest completion."""
    scores: list[float] | None = None
    """The verifier's scores of `steps`; None until verified."""
    floor: int = 1
    """The current revision index: later revisions never start before it."""
    active: bool = True
    stopped: str | None = None
    rounds: list[dict[str, Any]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def verify_and_revise(problems: list[Problem], tracker: Tracker, config: RevisionConfig,
                      choose: Choose) -> list[MethodOutput]:
    """The verify-then-revise loop, batched over problems; `choose` decides where a path is revised."""
    check_loop_config(config)
    if unresolved(config):
        raise ValueError(f"{', '.join(unresolved(config))}: chosen by `python -m inference.evaluate` "
                         "(inference.chosen_settings); give the method a revision and a threshold to run it directly")
    states = _first_paths(problems, tracker, config)
    for r in range(config.max_rounds + 1):
        last = r == config.max_rounds
        todo = [i for i, s in enumerate(states) if s.active and s.scores is None]
        if todo and (config.verify_final or not last):
            _verify(states, todo, problems, tracker)  # 1. every new path, in one call for all problems
        pending = _decide(states, choose, last)  # 2. accept, stop, or choose where to revise
        if not pending:
            break
        _revise(states, pending, problems, tracker, config, r)  # 3. in one call for all problems
    return [MethodOutput(prediction=extract_answer(s.text, problem.answer_kind), completion=s.text,
                         usage=tracker.usage[i],
                         trace={"rounds": s.rounds, "stopped": s.stopped,
                                "revisions": sum(1 for e in s.rounds if e["revised_index"] is not None),
                                "threshold": config.threshold, "revision": config.revision},
                         flags=s.flags)
            for i, (problem, s) in enumerate(zip(problems, states))]


def _first_paths(problems: list[Problem], tracker: Tracker, config: RevisionConfig) -> list[_State]:
    """Round 0: one sampled path per problem; a path with no steps stops as unverifiable."""
    initial = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                             top_p=config.top_p, n=1, seed=config.seed)
    outputs = tracker.generate(list(range(len(problems))), [solve_prompt(p.question) for p in problems], initial)
    states = []
    for problem, (c, *_) in zip(problems, outputs):
        path = split_steps(c.text)
        state = _State(steps=list(path.steps), text=c.text)
        state.flags += completion_flags(c, path, extract_answer(c.text, problem.answer_kind))
        state.rounds.append({"round": 0, "steps": list(path.steps), "scores": None, "revised_index": None,
                             **_generation_tokens(c)})
        if not path.steps:
            state.active, state.stopped = False, "unverifiable"
            state.flags.append("unverifiable")
        states.append(state)
    return states


def _verify(states: list[_State], todo: list[int], problems: list[Problem], tracker: Tracker) -> None:
    """The verifier's scores of the paths at `todo`, with its tokens; an unscorable path stops."""
    spent: list[int] = []
    scored = tracker.score_paths(todo, [problems[i].question for i in todo], [states[i].steps for i in todo],
                                 tokens=spent)
    for i, scores, tokens in zip(todo, scored, spent):
        s = states[i]
        s.rounds[-1]["scores"] = scores
        s.rounds[-1]["verifier_tokens"] = tokens
        if scores is None:
            s.active, s.stopped = False, "unscorable"
            s.flags.append("unscorable")
        else:
            s.scores = list(scores)


def _decide(states: list[_State], choose: Choose, last: bool) -> list[tuple[int, int, float]]:
    """Each active path accepted, stopped, or sent for revision: (problem, revised index, choice
    value) for those revised; the kept prefix never shrinks below the path's floor."""
    pending: list[tuple[int, int, float]] = []
    for i, s in enumerate(states):
        if not s.active:
            continue
        if s.scores is None:  # the last revision, left unverified (verify_final off)
            s.active, s.stopped = False, "max_rounds"
            continue
        decision = choose(s.scores, s.floor)
        if decision is None:
            s.active, s.stopped = False, "accepted"
        elif last:
            s.active, s.stopped = False, "max_rounds"
        else:
            k, p = decision
            k = min(max(k, s.floor), len(s.steps))  # the kept prefix is kept
            s.floor = k
            pending.append((i, k, p))
    return pending


def _revise(states: list[_State], pending: list[tuple[int, int, float]], problems: list[Problem],
            tracker: Tracker, config: RevisionConfig, r: int) -> None:
    """Steps k.. of every pending path rewritten (revision prompt or resampled from the kept
    prefix); a revision with no steps keeps the old path and is flagged unusable."""
    temperature = config.temperature if config.revision == "prompt" else config.resample_temperature
    prompts = []
    for i, k, p in pending:
        q, steps = problems[i].question, states[i].steps
        prompts.append(revise_prompt(q, steps, k, p) if config.revision == "prompt"
                       else solve_prompt(q, steps[: k - 1]))
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=temperature,
                            top_p=config.top_p, n=1, seed=config.seed + r + 1)
    revised = tracker.generate([i for i, _, _ in pending], prompts, params)
    for (i, k, _), (c, *_) in zip(pending, revised):
        s, kind = states[i], problems[i].answer_kind
        kept = s.steps[: k - 1]
        new = split_steps(c.text)
        text = prefix_text(kept) + c.text
        s.flags += completion_flags(c, new, extract_answer(text, kind))
        if new.steps:
            s.steps, s.text, s.scores = kept + list(new.steps), text, None
            s.rounds.append({"round": r + 1, "steps": list(s.steps), "scores": None, "revised_index": k,
                             **_generation_tokens(c)})
        else:
            s.flags.append("revision_unusable")
            s.rounds.append({"round": r + 1, "steps": list(s.steps), "scores": s.scores, "revised_index": k,
                             "unusable": True, **_generation_tokens(c)})


def _generation_tokens(c) -> dict[str, int]:
    """The tokens of the generation that wrote a round's path; its verification adds
    `verifier_tokens` when the path is scored (0 until then)."""
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "verifier_tokens": 0}


def run(problems: list[Problem], tracker: Tracker, config: Config) -> list[MethodOutput]:
    return verify_and_revise(problems, tracker, config,
                             lambda scores, floor: first_rejected(scores, float(config.threshold or 0.0), floor))
