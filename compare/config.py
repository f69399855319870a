"""The comparison's configuration: nested dataclasses with one docstring per field
(`configs/compare/tiny_world.yaml` writes every default out), read from the embedded default, a
YAML recipe, the `--quick` overlay and `--set section.key=value` items, and validated as a whole
before any stage runs."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "compare" / "tiny_world.yaml"
QUICK_CONFIG = ROOT / "configs" / "compare" / "quick.yaml"

BUDGET_KEYS = ("max_steps", "prompts_per_update", "num_generations", "n_prompts", "max_completion_length", "seed",
               "dataset", "temperature")
"""PPO flags that make up the budget: the same for every PPO run."""
REFERENCE = "stepco_exact"
"""The label of the StepCo cell with the world's exact checker (an upper reference, not a method)."""
RESOLVED = "compare_config.json"
"""The resolved config a run writes into its output directory (what the stage subprocesses read)."""
METHOD_NAMES = {"greedy": "greedy", "self_consistency": "self-consistency", "best_of_n": "Best-of-N",
                "stepco": "StepCo", "pathco": "PathCo", "beats": "BEATS",
                REFERENCE: "StepCo + exact checker (reference)"}
POLICY_NAMES = {"sft": "SFT", "outcome_ppo": "outcome-PPO", "step_ppo": "step-PPO"}


def policy_label(p: str) -> str:
    """A policy's name as tables write it."""
    return POLICY_NAMES.get(p, p)


class CompareError(ValueError):
    """A config, artefact or stage this script cannot work with; the message says which."""


VERIFIER_LM = "verifier_lm"
"""The name that stands for the verifier LM's directory in a verifier spec (`step-likelihood:verifier_lm`)."""


def _sft_args() -> dict[str, Any]:
    return {"arch": "llama", "hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 1024,
            "n_train": 30000, "n_eval": 200, "world_seed": 0, "world_p_inverse": 0.5,
            "teacher_noise": "inverse=0.7,stale=0.7",
            "tasks": "solve=1.0,explore=0.1,revise=0.2,clarify=0.05,verify=0.1", "learning_rate": 0.002,
            "lr_scheduler_type": "cosine", "warmup_steps": 0.03, "per_device_train_batch_size": 32,
            "num_train_epochs": 1, "max_new_tokens": 160, "seed": 0, "report_to": "none", "disable_tqdm": True}


def _verifier_lm_args() -> dict[str, Any]:
    return {**_sft_args(), "n_train": 40000, "tasks": "solve=1.0,explore=0.1", "teacher_noise": "none"}


def _ppo_args() -> dict[str, Any]:
    return {"max_steps": 120, "prompts_per_update": 16, "num_generations": 8, "n_prompts": 4000,
            "max_completion_length": 128, "seed": 0, "advantage_estimator": "group", "num_mini_batches": 4,
            "learning_rate": 2e-5, "beta": 0.02, "reward_shaping": "raw", "outcome_aggregation": "mean",
            "eval_dataset": "none", "save_steps": 20, "report_to": "none", "disable_tqdm": True}


def _methods() -> dict[str, dict[str, Any]]:
    return {
        "greedy": {"max_new_tokens": 192},
        "self_consistency": {"n": 16, "temperature": 0.8, "max_new_tokens": 192},
        "best_of_n": {"n": 16, "temperature": 0.8, "aggregation": "mean", "max_new_tokens": 192},
        "stepco": {"max_rounds": 5, "threshold": 0.5, "revision": "resample", "max_new_tokens": 192},
        "beats": {"max_depth": 7, "max_forward_steps": 5, "branching": 2, "width": 8, "temperature": 0.7},
    }


@dataclass
class SFTSection:
    path: str | None = None
    """An existing policy directory used as the SFT policy instead of training one (null: train)."""
    args: dict[str, Any] = field(default_factory=_sft_args)
    """Flags of `python -m rl.sft`; compare sets --output_dir."""


@dataclass
class VerifierLMSection:
    path: str | None = None
    """An existing causal LM directory used as the verifier LM instead of training one (null: train)."""
    args: dict[str, Any] = field(default_factory=_verifier_lm_args)
    """Flags of `python -m rl.sft` for the verifier LM (compare sets --output_dir). It is built only
    when a verifier spec names it (`psv.path`, `psv.combine_with` or `eval.verifier`, as
    `step-likelihood:verifier_lm`, for instance)."""


@dataclass
class PSVSection:
    path: str | None = "step-likelihood:verifier_lm"
    """An existing verifier spec (PSV directory, confidence, math-shepherd:PATH, ...) used instead of
    training a PSV; `verifier_lm` in it stands for the verifier LM's directory. null: annotate and
    train a PSV here."""
    n_problems: int = 300
    """World train problems annotated with StepCo's tree."""
    annotate: dict[str, Any] = field(default_factory=lambda: {"method": "tree", "seed": 1, "disable_tqdm": True})
    """Fields of reward_models.annotate.AnnotateConfig (policy, out, n set by compare)."""
    train: dict[str, Any] = field(default_factory=lambda: {"num_train_epochs": 2.0, "learning_rate": 1e-3,
                                                           "per_device_train_batch_size": 16, "seed": 0})
    """Keyword arguments of reward_models.train.train_verifier (init_from, output_dir set by compare)."""
    combine_with: str | None = None
    """Another verifier spec joined with the PSV step by step, e.g. `step-confidence` (a bare
    confidence spec reads the SFT policy); the joined verifier is then used everywhere (PPO rewards
    and every method). null: the PSV alone."""
    combine_rule: str = "product"
    """How the two are joined: product or min (reward_models.combined)."""


@dataclass
class PPORun:
    reward: str = "step"
    """rl/ppo_step.py --reward: step, outcome, gold or step+gold."""
    path: str | None = None
    """An existing trained policy directory instead of training (null: train)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Flags of this run only; the budget flags may not differ between runs."""


@dataclass
class PPOSection:
    args: dict[str, Any] = field(default_factory=_ppo_args)
    """Flags of rl/ppo_step.py shared by every run (the budget)."""
    runs: dict[str, PPORun] = field(default_factory=lambda: {
        "outcome_ppo": PPORun(reward="gold"),
        "step_ppo": PPORun(reward="gold", args={"advantage_estimator": "mc_values"})})
    """The PPO policies by name."""
    seeds_page: str | None = "docs/results/mc_values_world.md"
    """The results page with this recipe's PPO runs over three or more seeds, which the report links
    beside its one-seed PPO rows (null: the results index)."""


@dataclass
class EvalSection:
    dataset: str = "world"
    """world, world:dev, a benchmark name (gsm8k, math500, ...) or a .jsonl file."""
    n_problems: int = 200
    """Problems evaluated (the first n)."""
    world_seed: int = 0
    """Seed of the world problems."""
    data_dir: str | None = None
    """Folder of benchmark files (null: $STEPRL_DATA_DIR or ../shared/data)."""
    source: str = "auto"
    """Benchmark source: auto, local or hub."""
    backend: str = "hf"
    """Generator backend: hf, vllm or openai."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the backend."""
    batch_size: int = 64
    """Sequences per generation batch (hf)."""
    verifier_batch_size: int = 32
    """Paths per verifier forward pass."""
    device: str | None = None
    """Device of local models (null: cuda when available)."""
    chunk_size: int = 50
    """Problems per method call (results saved after each)."""
    seed: int = 0
    """Seed of every method in every cell."""
    bootstrap_samples: int = 1000
    """Resamples of the bootstrap intervals."""
    verifier: str | None = None
    """Verifier spec of the methods (null: the PSV)."""
    methods: dict[str, dict[str, Any]] = field(default_factory=_methods)
    """Method module name -> options of its Config."""
    reference_exact: bool = True
    """Also run StepCo with the exact checker (world only), as an upper reference."""
    curve_n: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """N of the self-consistency and Best-of-N points of the plot."""
    threshold_dev_problems: int | None = 100
    """StepCo's θ calibrated for earliest-error F1 on the SFT policy's greedy paths of this many
    world *dev* problems (disjoint from the test problems), labelled by the world's checker; it
    replaces methods.stepco.threshold for every policy (one verifier, one θ). null: the threshold
    as written. World evaluation only."""


@dataclass
class CompareConfig:
    cache_dir: str = "outputs/compare_cache"
    """Where trained artefacts are cached, by hash."""
    rebuild_on_code_change: bool = False
    """Also hash the source files that build each artefact (a code change retrains it); False: reuse
    and warn."""
    workers: int = 2
    """Stages run side by side (1: everything in this process)."""
    launcher: str | None = None
    """Command prefix that starts training scripts (e.g. accelerate launch ...); null: python."""
    policies: list[str] = field(default_factory=lambda: ["sft", "outcome_ppo", "step_ppo"])
    """Policies compared, in table order; the first is the base of the effects."""
    sft: SFTSection = field(default_factory=SFTSection)
    verifier_lm: VerifierLMSection = field(default_factory=VerifierLMSection)
    psv: PSVSection = field(default_factory=PSVSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    eval: EvalSection = field(default_factory=EvalSection)


def plain(value: Any) -> Any:
    """A dataclass config as nested dicts (JSON-ready)."""
    return json.loads(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value))


def deep_merge(base: Any, over: Any) -> Any:
    """`over` merged into `base`: mappings key by key (recursively), everything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _build(cls: type, values: Any, where: str) -> Any:
    """An instance of dataclass `cls` from a mapping, with errors naming the config key."""
    if not isinstance(values, dict):
        raise CompareError(f"{where or 'the config'}: expected a mapping, got {type(values).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise CompareError(f"unknown config key {where + '.' if where else ''}{unknown[0]}; "
                           f"known: {', '.join(names)}")
    kwargs: dict[str, Any] = {}
    nested = {"sft": SFTSection, "verifier_lm": VerifierLMSection, "psv": PSVSection, "ppo": PPOSection,
              "eval": EvalSection}
    for name, value in values.items():
        key = f"{where}.{name}" if where else name
        if cls is CompareConfig and name in nested:
            kwargs[name] = _build(nested[name], value, key)
        elif cls is PPOSection and name == "runs":
            if not isinstance(value, dict) or not value:
                raise CompareError(f"{key}: expected a mapping of run names to runs")
            kwargs[name] = {run: _build(PPORun, spec or {}, f"{key}.{run}") for run, spec in value.items()
                            if spec is not None}
        elif cls is EvalSection and name == "methods":
            if not isinstance(value, dict):
                raise CompareError(f"{key}: expected a mapping of method names to options")
            kwargs[name] = {m: dict(opts or {}) for m, opts in value.items() if opts is not None}
        else:
            _check_type(cls, name, value, key)
            kwargs[name] = value
    return cls(**kwargs)


def _check_type(cls: type, name: str, value: Any, key: str) -> None:
    """A clear error for a config value of the wrong type (null is allowed where the type is optional)."""
    import types
    import typing

    hint = typing.get_type_hints(cls).get(name)
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return
    ok = False
    for tp in allowed:
        origin = typing.get_origin(tp) or tp
        if origin is float:
            ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
        elif origin is int:
            ok = ok or (isinstance(value, int) and not isinstance(value, bool))
        elif origin in (str, bool, list, dict):
            ok = ok or isinstance(value, origin)
    if not ok:
        raise CompareError(f"{key}: expected {hint}, got {value!r}")


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise CompareError(f"--config {path}: no such file") from None
    except yaml.YAMLError as e:
        raise CompareError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: expected a mapping at the top level")
    return data


def parse_set(item: str) -> dict[str, Any]:
    """`a.b.c=value` (the value read as YAML) as a nested mapping."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise CompareError(f"--set {item!r}: expected section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise CompareError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    out: dict[str, Any] = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, quick: bool = False, sets: Sequence[str] = (),
                overrides: dict[str, Any] | None = None) -> CompareConfig:
    """The embedded default, then the file, the quick overlay, `--set` items and `overrides`."""
    from rl.setting_names import Deprecations

    notes = Deprecations()
    values = plain(CompareConfig())
    if path is not None:
        values = deep_merge(values, with_ppo_names(_read_yaml(Path(path)), notes, f"{path}: "))
    if quick:
        values = deep_merge(values, with_ppo_names(_read_yaml(QUICK_CONFIG), notes, f"{QUICK_CONFIG}: "))
    for item in sets:
        values = deep_merge(values, with_ppo_names(parse_set(item), notes, "--set "))
    if overrides:
        values = deep_merge(values, with_ppo_names(overrides, notes, ""))
    notes.print()
    config = _build(CompareConfig, values, "")
    validate(config)
    return config


def with_ppo_names(values: dict[str, Any], notes=None, where: str = "") -> dict[str, Any]:
    """A config mapping whose PPO flags (`ppo.args`, `ppo.runs.<name>.args`) written under earlier
    setting names are translated to TRL's (rl/setting_names.py; each noted in `notes` when given)."""
    from rl.ppo_config import ConfigError
    from rl.setting_names import translate_settings

    ppo = values.get("ppo")
    if not isinstance(ppo, dict):
        return values
    ppo = dict(ppo)
    try:
        if isinstance(ppo.get("args"), dict):
            ppo["args"] = translate_settings(ppo["args"], notes, f"{where}ppo.args.")
        if isinstance(ppo.get("runs"), dict):
            ppo["runs"] = {name: ({**run,
                                   "args": translate_settings(run["args"], notes, f"{where}ppo.runs.{name}.args.")}
                                  if isinstance(run, dict) and isinstance(run.get("args"), dict) else run)
                           for name, run in ppo["runs"].items()}
    except ConfigError as err:
        raise CompareError(str(err)) from None
    return {**values, "ppo": ppo}


def _validate_training_sections(cfg: CompareConfig) -> None:
    """The PPO runs' flags (no budget flag per run, nothing compare sets itself), the SFT and verifier
    LM output folders, and the PSV combination."""
    for name, run in cfg.ppo.runs.items():
        clash = sorted(k for k in run.args if k in BUDGET_KEYS)
        if clash:
            raise CompareError(f"ppo.runs.{name}.args.{clash[0]}: a budget flag; set it in ppo.args so every "
                               "PPO run has the same budget")
        for key in ("policy", "model_name_or_path", "verifier", "output_dir", "reward"):
            if key in run.args or key in cfg.ppo.args:
                raise CompareError(f"ppo args: {key} is set by compare (use ppo.runs.<name>.reward, sft.path, "
                                   "psv.path)")
    if "output_dir" in cfg.sft.args:
        raise CompareError("sft.args.output_dir is set by compare (use sft.path for an existing policy)")
    if "output_dir" in cfg.verifier_lm.args:
        raise CompareError("verifier_lm.args.output_dir is set by compare (use verifier_lm.path for an existing model)")
    if cfg.psv.combine_with is not None:
        from reward_models.load import COMBINE_RULES, split_spec

        if cfg.psv.combine_rule not in COMBINE_RULES:
            raise CompareError(f"psv.combine_rule must be one of {', '.join(COMBINE_RULES)}, "
                               f"got {cfg.psv.combine_rule!r}")
        if not str(cfg.psv.combine_with).strip() or split_spec(cfg.psv.combine_with)[0] in COMBINE_RULES:
            raise CompareError(f"psv.combine_with must be one verifier spec, got {cfg.psv.combine_with!r}")


def _validate_eval_section(ev: EvalSection) -> None:
    """The evaluation's sizes, θ's dev problems, and each method's options (no `auto` left)."""
    from inference.evaluate import load_method

    if ev.n_problems < 1:
        raise CompareError(f"eval.n_problems must be >= 1, got {ev.n_problems}")
    if ev.threshold_dev_problems is not None:
        if ev.threshold_dev_problems < 2:
            raise CompareError(f"eval.threshold_dev_problems must be >= 2 or null, got {ev.threshold_dev_problems}")
        if not ev.dataset.startswith("world"):
            raise CompareError("eval.threshold_dev_problems calibrates on world dev paths: set it to null and "
                               "give eval.methods.stepco.threshold for other datasets")
    if ev.chunk_size < 1 or ev.batch_size < 1 or ev.bootstrap_samples < 1:
        raise CompareError("eval.chunk_size, eval.batch_size and eval.bootstrap_samples must be >= 1")
    if not ev.methods:
        raise CompareError("eval.methods: name at least one method")
    for method, options in ev.methods.items():
        if method == REFERENCE:
            raise CompareError(f"eval.methods: {REFERENCE} is the reference row, set eval.reference_exact")
        try:
            mcfg = method_config(load_method(method), options, ev.seed)
        except (TypeError, ValueError) as e:
            raise CompareError(f"eval.methods.{method}: {e}") from None
        from inference.methods.stepco import RevisionConfig, unresolved

        if isinstance(mcfg, RevisionConfig) and unresolved(mcfg):  # `auto` is the evaluation CLI's to choose
            raise CompareError(f"eval.methods.{method}: give {' and '.join(u.split('=')[0] for u in unresolved(mcfg))} "
                               "(prompt or resample; a number): compare does not choose them")


def validate(cfg: CompareConfig) -> None:
    if cfg.workers < 1:
        raise CompareError(f"workers must be >= 1, got {cfg.workers}")
    if not cfg.policies:
        raise CompareError("policies: name at least one policy")
    known = {"sft", *cfg.ppo.runs}
    for name in cfg.policies:
        if name not in known:
            raise CompareError(f"policies: {name!r} is neither 'sft' nor a run of ppo.runs ({', '.join(cfg.ppo.runs)})")
    if len(set(cfg.policies)) != len(cfg.policies):
        raise CompareError("policies: a policy is named twice")
    _validate_training_sections(cfg)
    ev = cfg.eval
    if not ev.dataset.startswith("world"):
        for what, data in (("ppo.args.dataset", cfg.ppo.args.get("dataset", "world")),
                           ("psv.annotate.data", cfg.psv.annotate.get("data", "world"))):
            if str(data) == ev.dataset:
                raise CompareError(f"{what} is the evaluation set ({ev.dataset}): training would see the problems "
                                   "it is evaluated on; give it a train split (e.g. a .jsonl file)")
    _validate_eval_section(ev)
    if any(not isinstance(n, int) or n < 1 for n in ev.curve_n):
        raise CompareError(f"eval.curve_n must be positive integers, got {ev.curve_n}")
    for where, spec in (("psv.path", cfg.psv.path), ("psv.combine_with", cfg.psv.combine_with),
                        ("eval.verifier", ev.verifier)):
        if spec is not None:
            check_verifier_spec(spec, where)
    check_training_flags(cfg)


def names_verifier_lm(spec: str | None) -> bool:
    """Whether a verifier spec reads the verifier LM (a part `<prefix>:verifier_lm`)."""
    from reward_models.load import spec_parts, split_spec

    if not spec:
        return False
    try:
        return any(split_spec(part)[1] == VERIFIER_LM for part in spec_parts(str(spec)))
    except ValueError:
        return False


def uses_verifier_lm(cfg: CompareConfig) -> bool:
    """Whether any verifier of the run (PSV, its partner, the methods' verifier) reads the verifier LM."""
    return any(names_verifier_lm(s) for s in (cfg.psv.path, cfg.psv.combine_with, cfg.eval.verifier))


def check_verifier_spec(spec: str, where: str) -> None:
    """A verifier spec's form, checked by the verifier registry without loading anything
    (`reward_models.load.check_spec_form`: every part a registered kind, or an existing directory),
    so a typo fails before any stage."""
    from reward_models.load import check_spec_form

    try:
        check_spec_form(str(spec))
    except ValueError as e:
        raise CompareError(f"{where}: {e}") from None


def check_training_flags(cfg: CompareConfig) -> None:
    """`sft.args`, `verifier_lm.args` (when it is built) and each PPO run's flags parsed as `rl.sft`
    and `rl/ppo_step.py` will parse them (the same dataclasses, the same checks), so a typo fails
    before any stage runs, --dry_run too."""
    from reasoning.corpora import parse_teacher_noise
    from rl.ppo_config import StepPPOConfig
    from rl.sft import WorldSFTArguments, WorldSFTConfig

    sections = [("sft.args", cfg.sft.args)] if not cfg.sft.path else []
    if uses_verifier_lm(cfg) and not cfg.verifier_lm.path:
        sections.append(("verifier_lm.args", cfg.verifier_lm.args))
    for where, flags in sections:
        args, _ = _parse_flags("rl.sft", (WorldSFTArguments, WorldSFTConfig), {k: (where, v) for k, v in flags.items()})
        try:
            args.world_config()
            args.task_weights()
            parse_teacher_noise(args.teacher_noise)
        except ValueError as e:
            raise CompareError(f"{where}: {e}") from None
    for name, run in cfg.ppo.runs.items():
        if name not in cfg.policies or run.path:
            continue
        values = {**{k: ("ppo.args", v) for k, v in cfg.ppo.args.items()},
                  **{k: (f"ppo.runs.{name}.args", v) for k, v in run.args.items()},
                  "reward": (f"ppo.runs.{name}.reward", run.reward)}
        _check_ppo_flag_names(values)
        _parse_flags("rl/ppo_step.py", (StepPPOConfig,), values, settings=f"ppo.runs.{name} (with ppo.args)")


def _check_ppo_flag_names(values: dict[str, tuple[str, Any]]) -> None:
    """rl/ppo_step.py's own check of the flag names (an inherited TrainingArguments flag it does not
    read is refused, with the flag that does it), as a CompareError naming the config key."""
    from rl.ppo_cli import check_given_names
    from rl.ppo_config import ConfigError

    for flag, (where, _) in values.items():
        try:
            check_given_names([flag], [])
        except ConfigError as e:
            raise CompareError(f"{where}.{flag}: {e} (rl/ppo_step.py)") from None


def _parse_flags(script: str, types: tuple[type, ...], values: dict[str, tuple[str, Any]],
                 settings: str | None = None) -> list[Any]:
    """`values` (flag -> (config section, value)) parsed by the script's own dataclasses; an
    unknown flag or a bad value is a CompareError naming the config key, and settings that do not
    work together (the dataclass's own checks) one naming `settings` (default: the script)."""
    import argparse

    from trl import TrlParser

    parser = TrlParser(types)

    def error(message: str) -> None:
        named = re.match(r"argument --([\w-]+)", message)
        flag = named.group(1).replace("-", "_") if named else None
        where = f"{values[flag][0]}.{flag}" if flag in values else script
        raise CompareError(f"{where}: {message.split(': ', 1)[-1]} ({script})")

    parser.error = error  # argparse reports bad values here; raise instead of exiting
    argv = to_argv({k: v for k, (_, v) in values.items()}) + ["--output_dir", "compare-flag-check"]
    try:
        *parsed, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except CompareError:
        raise
    except (ValueError, TypeError, argparse.ArgumentError) as e:
        raise CompareError(f"{settings or script}: {e}") from None
    unknown = [x[2:] for x in rest if x.startswith("--")]
    if unknown:
        flag = unknown[0].replace("-", "_")
        where = values.get(flag, (script,))[0]
        raise CompareError(f"{where}.{flag}: not a flag of {script}")
    return parsed


def to_argv(args: dict[str, Any]) -> list[str]:
    """A mapping as command-line flags (booleans as true/false; None means the script's default)."""
    argv = []
    for k, v in args.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        argv += [f"--{k}", str(v)]
    return argv


def method_config(module, options: dict[str, Any], seed: int):
    """The method's Config from config options, with the shared seed."""
    fields = {f.name for f in dataclasses.fields(module.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; options: {', '.join(sorted(fields))}")
    values = dict(options)
    if "seed" in fields:
        values["seed"] = seed
    return module.Config(**values)




def from_dict(values: dict[str, Any]) -> CompareConfig:
    """A config from its nested-dict form (`plain`), e.g. a resolved config file; not validated."""
    return _build(CompareConfig, with_ppo_names(values), "")
