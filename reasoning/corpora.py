"""Training corpora built from the world, one row format for every prompt the toolkit uses.

Rows are `{"prompt", "completion", "task", "id"}` (TRL's prompt-completion format):

- `solve`: chain of thought with step tags (also StepCo's positive style D+ and BEATS' one-step-
  forward and final-answer actions, which continue the same format from a prefix);
- `explore`: StepCo's exploratory style D-: paths that may carry an injected error;
- `revise`: StepCo's feedback prompt on a path with an error at step k; the completion rewrites
  steps k.. after the kept steps 1..k-1;
- `clarify`: BEATS' clarify-question action: the question without its distractor sentences;
- `verify`: back-verification: re-solve, then a verdict on a proposed (right or wrong) answer.
"""

from __future__ import annotations

import random
from typing import Any

from reasoning import prompts
from reasoning.steps import join_steps
from reasoning.world import MISREADINGS, corrupt_steps, misreadings_of, teacher_solution

TASKS = ("solve", "explore", "revise", "clarify", "verify")
DEFAULT_TASK_WEIGHTS = {"solve": 1.0, "explore": 0.1, "revise": 0.2, "clarify": 0.05, "verify": 0.05}


def clarified_question(row: dict[str, Any]) -> str:
    """The question with the world's distractor sentences removed."""
    text = row["question"]
    for sentence in row["world"]["distractors"]:
        text = text.replace(sentence + " ", "").replace(" " + sentence, "")
    return text


def parse_teacher_noise(spec: str | dict[str, float] | None) -> dict[str, float]:
    """'inverse=0.7,stale=0.7' (or 'none' / '') -> {kind: rate}, each kind in MISREADINGS."""
    if spec is None or isinstance(spec, dict):
        noise = dict(spec or {})
    else:
        noise = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            if part == "none":
                continue
            name, sep, value = part.partition("=")
            try:
                noise[name.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep:
                raise ValueError(f"--teacher_noise: expected kind=rate, got {part!r}")
    for name, rate in noise.items():
        if name not in MISREADINGS:
            raise ValueError(f"--teacher_noise: unknown kind {name!r}; choose from {', '.join(MISREADINGS)}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"--teacher_noise: {name}={rate} is not a rate in [0, 1]")
    return noise


def teacher_steps(row: dict[str, Any], noise: dict[str, float], rng: random.Random) -> tuple[list[str], list[str]]:
    """The demonstration a noisy teacher writes for `row`, and the kinds it misread: each kind of
    decision the problem has is misread with its rate, and the misreading is carried to the answer."""
    kinds = [k for k in misreadings_of(row) if rng.random() < noise.get(k, 0.0)]
    steps = teacher_solution(row, kinds) if kinds else None
    return (steps, kinds) if steps is not None else (list(row["steps"]), [])


def make_row(row: dict[str, Any], task: str, rng: random.Random,
             solution: list[str] | None = None) -> dict[str, str]:
    """One corpus row of `task` for a world row; `solution` replaces the gold steps of a `solve`
    row (a noisy teacher's demonstration)."""
    question, gold = row["question"], row["steps"]
    if task == "solve":
        prompt, completion = prompts.solve_prompt(question), join_steps(solution or gold)
    elif task == "explore":
        steps = corrupt_steps(row, rng)[0] if rng.random() < 0.7 else gold
        prompt, completion = prompts.explore_prompt(question), join_steps(steps)
    elif task == "revise":
        steps, at, _ = corrupt_steps(row, rng)
        probability = round(rng.uniform(0.02, 0.45), 2)
        prompt = prompts.revise_prompt(question, steps, at + 1, probability)
        completion = join_steps(gold[at:])
    elif task == "clarify":
        prompt, completion = prompts.clarify_prompt(question), " " + clarified_question(row)
    elif task == "verify":
        if rng.random() < 0.5:
            proposed, verdict = row["answer"], prompts.VERDICT_CORRECT
        else:
            wrong = corrupt_steps(row, rng)[0][-1]
            proposed = wrong.split("<ans>")[1].split("</ans>")[0]
            verdict = prompts.VERDICT_CORRECT if proposed == row["answer"] else prompts.VERDICT_INCORRECT
        prompt, completion = prompts.verify_prompt(question, proposed), join_steps(gold) + "\n" + verdict
    else:
        raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
    return {"prompt": prompt, "completion": completion, "task": task, "id": row["id"]}


def build_corpus(rows: list[dict[str, Any]], weights: dict[str, float] | None = None, seed: int = 0,
                 teacher_noise: str | dict[str, float] | None = None) -> list[dict]:
    """One `solve` row per problem times its weight, the other tasks in proportion, shuffled.

    `teacher_noise` ({kind: rate} or 'inverse=0.7,stale=0.7'): `solve` demonstrations take the
    plausible wrong reading of each kind of decision at its rate (`teacher_steps`); the other tasks
    keep the gold steps. Its draws come from their own generator, so the clean corpus of a seed is
    the same with or without the option."""
    weights = dict(DEFAULT_TASK_WEIGHTS if weights is None else weights)
    noise = parse_teacher_noise(teacher_noise)
    noise_rng = random.Random(f"teacher-noise-{seed}")
    unknown = set(weights) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown tasks {sorted(unknown)}; choose from {TASKS}")
    rng = random.Random(seed)
    corpus = []
    for task, weight in weights.items():
        if weight < 0:
            raise ValueError(f"task weight must be >= 0, got {task}={weight}")
        whole, frac = int(weight), weight - int(weight)
        for row in rows:
            for _ in range(whole + (rng.random() < frac)):
                solution, misread = (teacher_steps(row, noise, noise_rng) if task == "solve" and noise
                                     else (None, []))
                made = make_row(row, task, rng, solution)
                if misread:
                    made["misread"] = ",".join(misread)
                corpus.append(made)
    rng.shuffle(corpus)
    return corpus
