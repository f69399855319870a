"""StepCo's (and PathCo's) settings left to `auto`, chosen before the evaluation runs.

A default must never make a run worse than leaving the feature off. StepCo's two settings that
depend on the policy and the verifier are therefore chosen here, from what they are:

- **revision** (`auto`): `prompt` (the paper's feedback prompt) when the policy was taught the
  revise format (`reasoning.world.taught_tasks`: `rl.sft --tasks ...,revise=W` records it in the
  policy's `teacher.json`), else `resample` (continue the kept steps, which any policy can do). An
  explicit `prompt` for a local policy known not to be taught it is refused (`check_settings`):
  such a policy answers the feedback prompt with noise.
- **θ** (StepCo, `auto`): calibrated on held-apart problems, the world's dev split (never the test
  problems evaluated), exactly as `reward_models.verifier_metrics --calibrate-on world:dev` calibrates a
  verifier (`reward_models.verifier_metrics.calibrate_on_items`: sampled paths, exact earliest errors, the
  F1-best threshold). Then StepCo at that θ runs on other dev problems; θ is kept only when it beats
  StepCo's own first paths there (the paired 95% interval's lower bound above 0), otherwise θ is 0:
  never revise, so StepCo is its first path. A benchmark or a file has no held-apart split here:
  give `--threshold` (`reward_models.verifier_metrics --calibrate-on DEV` calibrates one).

The choice is printed as one line on stderr, recorded as `chosen` in the run's summary, and cached
in `DIR/threshold_calibration.json` under everything it depends on, so a re-run is quick.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from inference.methods.stepco import AUTO, RevisionConfig
from reward_models.load import is_reference_spec

__all__ = ["CACHE", "CALIBRATION_PROBLEMS", "CHECK_PROBLEMS", "ChoiceError", "beats_first_paths", "check_settings",
           "choose_settings"]

CACHE = "threshold_calibration.json"
CALIBRATION_PROBLEMS = 100
"""World dev problems θ is calibrated on (`reward_models.verifier_metrics`'s `--world_n`)."""
CHECK_PROBLEMS = 200
"""Other world dev problems on which StepCo at the calibrated θ must beat its first paths."""


class ChoiceError(ValueError):
    """A setting that cannot be used or chosen; the message names the flag."""


def _is_loop(config: Any) -> bool:
    return isinstance(config, RevisionConfig)


def _world_split(dataset: str) -> str | None:
    if dataset == "world" or dataset.startswith("world:"):
        return dataset.partition(":")[2] or "test"
    return None


def check_settings(config: Any, policy: str, dataset: str, verifier: str | None) -> None:
    """What can be refused before anything loads: an explicit `revision=prompt` for a policy known
    not to be taught the revise format, and a θ left to `auto` where nothing held apart calibrates it."""
    if not _is_loop(config):
        return
    from reasoning.world import taught_tasks

    tasks = taught_tasks(policy)
    if config.revision == "prompt" and tasks is not None and "revise" not in tasks:
        raise ChoiceError(f"--revision prompt: {policy} was not taught the revise format (it was taught "
                          f"{', '.join(tasks)}), so it cannot follow StepCo's feedback prompt; use --revision "
                          "resample (or auto), or a policy trained with rl.sft --tasks solve=1.0,revise=0.2")
    if config.threshold is None and config.max_rounds > 0:  # with no revision round θ is not used
        split = _world_split(dataset)
        if split is None:
            raise ChoiceError(f"--threshold auto calibrates θ on the world's dev split; --dataset {dataset} has "
                              "none held apart here: give --threshold (python -m reward_models.verifier_metrics "
                              "--verifier V --data DATA --calibrate-on DEV prints a calibrated one)")
        if split not in ("test",):
            raise ChoiceError(f"--threshold auto calibrates θ on the world's dev split, held apart from the test "
                              f"problems; --dataset {dataset} evaluates another split: give --threshold")
        if not verifier:
            raise ChoiceError("--threshold auto calibrates θ for the verifier: pass --verifier")


def _fingerprint(policy: str) -> dict[str, Any]:
    """What identifies a local policy's weights without reading them: each weight file's size and time."""
    folder = Path(policy)
    if not folder.is_dir():
        return {"name": policy}
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    return {"path": str(folder.resolve()), "weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def _revision(config: RevisionConfig, policy: str) -> tuple[str, str]:
    from reasoning.world import taught_tasks

    if config.revision != AUTO:
        return config.revision, "given"
    tasks = taught_tasks(policy)
    if tasks is None:
        return "resample", f"auto: what {policy} was taught is unknown (no teacher.json), so no feedback prompt"
    if "revise" in tasks:
        return "prompt", f"auto: {policy} was taught the revise format"
    return "resample", f"auto: {policy} was taught {', '.join(tasks)}, not the revise format"


def beats_first_paths(first: list[float], revised: list[float]) -> tuple[bool, dict[str, float]]:
    """Whether StepCo's answers (`revised`, 1 right / 0 wrong per problem) beat its first paths' on the
    same problems: the paired bootstrap 95% interval of the difference lies above 0. Also the difference."""
    from reasoning.stats import paired_bootstrap_diff

    diff = paired_bootstrap_diff(first, revised)
    return diff["ci_low"] > 0, diff


def _interval(d: dict[str, float]) -> str:
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def _calibrate(method: Any, config: RevisionConfig, generator: Any, verifier: Any, world_config: Any,
               world_seed: int, batch_size: int) -> dict[str, Any]:
    """θ by `reward_models.verifier_metrics`'s calibration on dev problems, then StepCo at θ against its first
    paths (StepCo at θ 0: the same initial paths, never revised) on other dev problems."""
    from backends.base import SamplingParams
    from inference.methods.base import Tracker, blind
    from reasoning.steps import answer_correct
    from reasoning.world import generate, row_to_problem
    from reward_models.verifier_metrics import EvalArguments as VerifierEvalArguments
    from reward_models.verifier_metrics import calibrate_on_items, sample_world_paths

    rows = generate("dev", CALIBRATION_PROBLEMS + CHECK_PROBLEMS, world_seed, world_config)
    cal_rows, check_rows = rows[:CALIBRATION_PROBLEMS], rows[CALIBRATION_PROBLEMS:]
    d = VerifierEvalArguments()  # the settings `reward_models.verifier_metrics --calibrate-on world:dev` samples with
    params = SamplingParams(max_new_tokens=d.max_new_tokens, temperature=d.temperature, top_p=d.top_p,
                            n=d.samples_per_problem, seed=d.seed)
    items = sample_world_paths(generator, cal_rows, d.samples_per_problem, params)
    record: dict[str, Any] = {"data": "world:dev", "problems": len(cal_rows), "paths": len(items),
                              "samples_per_problem": d.samples_per_problem, "temperature": d.temperature}
    try:
        calibration = calibrate_on_items(verifier, items, batch_size)
    except ValueError as err:  # every sampled path right, or every one wrong: F1 is undefined
        record["error"] = str(err)
        return {"threshold": 0.0, "calibration": record,
                "why": f"auto: θ not calibrated ({err}), so 0: never revise"}
    theta = float(calibration["threshold"])
    record.update(threshold=theta, f1=calibration["f1"], n=calibration["n"], skipped=calibration["skipped"]["total"])
    if theta <= 0.0:
        return {"threshold": 0.0, "calibration": record, "why": "auto: the calibrated θ is 0: never revise"}
    problems = [row_to_problem(r) for r in check_rows]
    correct: dict[float, list[float]] = {}
    for t in (theta, 0.0):
        tracker = Tracker(generator, verifier, len(problems))
        outputs = method.run(blind(problems), tracker, dataclasses.replace(config, threshold=t))
        correct[t] = [float(o.prediction is not None and answer_correct(o.completion, p, "flexible", o.prediction))
                      for p, o in zip(problems, outputs)]
    kept, diff = beats_first_paths(correct[0.0], correct[theta])
    check = {"data": "world:dev", "problems": len(problems), "first_paths": sum(correct[0.0]) / len(problems),
             "stepco": sum(correct[theta]) / len(problems), "diff": diff["diff"],
             "ci95": [diff["ci_low"], diff["ci_high"]]}
    where = (f"θ {theta:.4g} calibrated on {len(cal_rows)} world:dev problems (F1 {calibration['f1']:.3f}); "
             f"StepCo at it vs its first paths on {len(problems)} other dev problems {_interval(diff)}")
    if kept:
        return {"threshold": theta, "calibration": record, "dev_check": check, "why": f"auto: {where}, above 0"}
    return {"threshold": 0.0, "calibration": record, "dev_check": check,
            "why": f"auto: {where}, not above 0, so θ 0: never revise (StepCo is its first path)"}


def choose_settings(method: Any, config: Any, *, policy: str, verifier_spec: str | None, generator: Any,
                    verifier: Any, world_config: Any, world_seed: int, out_dir: str | Path,
                    batch_size: int = 32) -> tuple[Any, dict[str, Any] | None]:
    """`config` with its `auto` settings chosen, and the `chosen` record (None when nothing was left
    to choose). Calibrating θ loads the (lazy) generator and verifier; the result is cached in
    `out_dir/threshold_calibration.json` under what it depends on."""
    if not _is_loop(config) or (config.revision != AUTO and config.threshold is not None):
        return config, None
    revision, revision_why = _revision(config, policy)
    config = dataclasses.replace(config, revision=revision)
    chosen: dict[str, Any] = {"revision": revision, "revision_why": revision_why}
    cached = False
    if config.threshold is not None:
        chosen.update(threshold=config.threshold, threshold_why="given")
    elif config.max_rounds == 0:
        chosen.update(threshold=0.0, threshold_why="auto: max_rounds 0 revises nothing, so θ is not used; 0")
    elif is_reference_spec(verifier_spec):
        chosen.update(threshold=0.5, threshold_why="auto: the exact checker scores a step 0 or 1, so any θ in (0, 1] "
                                                    "is the same; 0.5")
    else:
        key = {"method": getattr(method, "__name__", str(method)), "policy": _fingerprint(policy),
               "verifier": verifier_spec, "config": {k: v for k, v in dataclasses.asdict(config).items()
                                                     if k != "threshold"},
               "world_config": dataclasses.asdict(world_config), "world_seed": world_seed,
               "calibration_problems": CALIBRATION_PROBLEMS, "check_problems": CHECK_PROBLEMS}
        key = json.loads(json.dumps(key, default=str))
        cache = Path(out_dir) / CACHE
        found, cached = None, False
        if cache.is_file():
            try:
                stored = json.loads(cache.read_text())
                found = stored["chosen"] if stored.get("key") == key else None
            except (ValueError, KeyError, TypeError):
                found = None
        if found is None:
            result = _calibrate(method, config, generator, verifier, world_config, world_seed, batch_size)
            found = {"threshold": result["threshold"], "threshold_why": result["why"],
                     "calibration": result["calibration"], **({"dev_check": result["dev_check"]}
                                                             if "dev_check" in result else {})}
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"key": key, "chosen": found}, indent=2) + "\n")
        else:
            cached = True
        chosen.update(found)
    config = dataclasses.replace(config, threshold=chosen["threshold"])
    name = getattr(method, "__name__", "").rsplit(".", 1)[-1] or "stepco"
    print(f"{name}: revision {revision} ({revision_why}); θ {chosen['threshold']:.4g} ({chosen['threshold_why']})"
          + (f" [from {Path(out_dir) / CACHE}]" if cached else ""), file=sys.stderr)
    return config, chosen
