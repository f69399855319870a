"""Step PPO's command line and YAML recipes: flags and `--config RECIPE.yaml` into a checked
`StepPPOConfig` (TRL's parser underneath), and the same for the baselines trained beside PPO.

Every error is a ConfigError of one line, in the names the user wrote (earlier setting names
included: rl/setting_names.py translates them here, once).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from reasoning.flag_names import closest
from rl.ppo_config import OWN_SETTINGS, ConfigError, StepPPOConfig
from rl.setting_names import EARLIER_NAMES, Deprecations, current_name, translate_argv, translate_settings
from rl.tracking import report_to

INHERITED_IN_USE = frozenset({
    "output_dir", "overwrite_output_dir", "learning_rate", "lr_scheduler_type", "weight_decay", "max_grad_norm",
    "adam_beta1", "adam_beta2", "adam_epsilon", "warmup_steps", "warmup_ratio", "bf16", "seed", "save_steps",
    "save_total_limit", "logging_steps", "logging_dir", "report_to", "run_name", "project", "disable_tqdm",
    "gradient_checkpointing", "resume_from_checkpoint", "push_to_hub", "hub_model_id", "hub_token",
    "hub_private_repo", "max_steps",
})
"""The `TrainingArguments` fields that step PPO reads; every other inherited flag is refused."""

INHERITED_INSTEAD = {
    "per_device_train_batch_size": "--prompts_per_update (prompts per update per process) and --num_generations",
    "per_device_eval_batch_size": "--greedy_eval_batch_size",
    "auto_find_batch_size": "--prompts_per_update and --generation_batch_size",
    "gradient_accumulation_steps": "--num_mini_batches (minibatches per pass over a rollout batch)",
    "num_train_epochs": "--max_steps (PPO updates)",
    "optim": "--learning_rate, --weight_decay, --adam_beta1, --adam_beta2, --adam_epsilon (step PPO uses AdamW)",
    "eval_strategy": "--eval_dataset (greedy accuracy before and after) and --probe_every (a learning curve)",
    "eval_steps": "--probe_every",
    "do_eval": "--eval_dataset",
    "save_strategy": "--save_steps (0: only at the end)",
    "logging_strategy": "--logging_steps",
    "fp16": "--dtype float16, or --bf16",
    "hub_strategy": "--push_to_hub (it pushes every checkpoint and the final policy)",
    "data_seed": "--seed",
}
"""What to use instead of an inherited flag that step PPO does not read."""

TRACKER_MODULES = {"wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",),
                   "comet_ml": ("comet_ml",), "aim": ("aim",), "mlflow": ("mlflow",), "clearml": ("clearml",),
                   "dvclive": ("dvclive",), "swanlab": ("swanlab",)}
"""The trackers of `--report_to` and the package each needs."""

OWN_FIELDS = tuple(OWN_SETTINGS)
"""Step PPO's own settings, in the order --help lists them."""


def _parser(types: tuple[type, ...]):
    """TRL's parser of `types`, whose errors are ConfigErrors (argparse would print its whole usage
    and exit)."""
    from trl import TrlParser

    class Parser(TrlParser):
        def error(self, message):
            raise ConfigError(message)

    return Parser(types)


def difflib_match(name: str, names) -> str | None:
    """The closest of `names` to `name` (`reasoning.flag_names.closest`, shared by every command line)."""
    return closest(name, names)


def _close(name: str, names) -> str:
    """"; did you mean --X?" with the closest of `names` (an earlier name suggests the current one)."""
    match = difflib_match(name, set(names) | set(EARLIER_NAMES))
    return f"; did you mean --{current_name(match)}?" if match else ""


def flag_names(argv: list[str]) -> list[str]:
    """The field names of the flags on a command line (`--x v`, `--x=v`, `--no_x`)."""
    bools = {f.name for f in fields(StepPPOConfig) if isinstance(f.default, bool)}  # argparse adds --no_X
    names = [t[2:].split("=", 1)[0] for t in argv if t.startswith("--") and len(t) > 2 and t != "--help"]
    return [n[3:] if n.startswith("no_") and n[3:] in bools else n for n in names]


def check_given_names(flags: list[str], keys: list[str]) -> None:
    """ConfigError (one line) for a flag step PPO does not know (with the closest name) or an
    inherited `TrainingArguments` flag or recipe key it does not use (with the flag that does it).
    An unknown recipe key is left to the parser, which names it with its value."""
    known = {f.name for f in fields(StepPPOConfig)}
    usable = set(OWN_FIELDS) | INHERITED_IN_USE
    for name, where in [*((k, "recipe key") for k in keys), *((f, "flag") for f in flags)]:
        if name not in known:
            if where == "flag":
                raise ConfigError(f"unknown flag --{name}{_close(name, usable)}")
            continue
        if name not in usable:
            instead = INHERITED_INSTEAD.get(name)
            hint = f"use {instead}" if instead else "remove it (--help lists the flags that work)"
            raise ConfigError(f"--{name} is a TrainingArguments flag that step PPO does not use: {hint}")


def check_report_to(value) -> None:
    """ConfigError (one line) for a tracker that does not exist or is not installed."""
    import importlib.util

    for tracker in report_to(value):
        if tracker == "all":
            continue
        modules = TRACKER_MODULES.get(tracker)
        if modules is None:
            match = difflib_match(tracker, TRACKER_MODULES)
            raise ConfigError(f"--report_to {tracker}: not a tracker (one of none, all, {', '.join(TRACKER_MODULES)})"
                              + (f"; did you mean {match}?" if match else ""))
        if not any(importlib.util.find_spec(m) is not None for m in modules):
            raise ConfigError(f"--report_to {tracker}: {modules[0]} is not installed (pip install {modules[0]}, or "
                              "pip install 'steprl[tracking]'), or pass --report_to none")


_SIMPLE_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def check_field_types(values: dict[str, Any]) -> None:
    """ConfigError for a value of the wrong type for one of StepPPOConfig's own fields (a YAML recipe's
    values are not converted the way flags are: `max_steps: [1]` would fail deep inside the run);
    checked before a config is made, whose checks compare the values."""
    for name, annotation in OWN_SETTINGS.items():
        if name not in values:
            continue
        parts = [p.strip() for p in str(annotation).split("|")]
        value = values[name]
        if value is None and "None" in parts:
            continue
        allowed = tuple(t for p in parts for t in _SIMPLE_TYPES.get(p, ()))
        if not allowed:
            continue
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"--{name} must be {' or '.join(parts)}, got {value!r}")


def read_recipe(path: str, notes: Deprecations) -> dict[str, Any]:
    """A YAML recipe as setting -> value under TRL's names (earlier names noted in `notes`); its
    `env` mapping is set in the environment, as TRL's parser does."""
    import yaml

    try:
        recipe = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"--config {path}: {err.strerror or err}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"--config {path}: not YAML ({' '.join(str(err).split())[:160]})") from None
    if recipe is None:
        recipe = {}
    if not isinstance(recipe, dict):
        raise ConfigError(f"--config {path}: must hold a YAML mapping of settings")
    env = recipe.pop("env", {})
    if not isinstance(env, dict):
        raise ConfigError(f"--config {path}: `env` must be a mapping")
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    return translate_settings({str(k): v for k, v in recipe.items()}, notes, f"{path}: ")


def _pop_config(argv: list[str]) -> tuple[list[str], str | None]:
    out, path, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a recipe path")
            path, i = argv[i + 1], i + 2
        elif argv[i].startswith("--config="):
            path, i = argv[i].split("=", 1)[1], i + 1
        else:
            out.append(argv[i])
            i += 1
    return out, path


def type_name(annotation: object) -> str:
    """A type as --help shows it: `float`, `int`, `str|None`, `list[str]|None` (a class's str() is
    `<class 'float'>`, a union's `typing.Optional[...]` or `str | None`)."""
    import types
    import typing

    if annotation is type(None):
        return "None"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return "|".join(type_name(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace(" ", "")


def help_text() -> str:
    """--help: step PPO's own flags first, then the inherited `TrainingArguments` flags it uses; the
    inherited flags it refuses are not listed."""
    import textwrap
    import typing

    by_name = {f.name: f for f in fields(StepPPOConfig)}
    # the declared types: HfArgumentParser rewrites a parsed dataclass's `field.type` (str | None -> str)
    hints = typing.get_type_hints(StepPPOConfig)

    def entry(name: str) -> str:
        f = by_name[name]
        default = f.default if f.default is not MISSING else None
        # transformers writes its help strings for argparse, which prints `%%` as `%`; this is printed as is
        text = " ".join(str(f.metadata.get("help", "")).replace("%%", "%").split())
        text = f"{text} (default: {default})" if text else f"(default: {default})"
        body = textwrap.fill(text, width=100, initial_indent=" " * 8, subsequent_indent=" " * 8)
        return f"  --{name} {type_name(hints.get(name, f.type))}\n{body}"

    inherited = [n for n in by_name if n in INHERITED_IN_USE and n not in OWN_FIELDS]
    return "\n".join([
        "usage: steprl-ppo [--config RECIPE.yaml] [--FLAG VALUE ...]   (one process; several: accelerate launch "
        "[--config_file CONFIG] rl/ppo_step.py [...])", "",
        "  -h, --help\n        show this help message and exit", "",
        "step PPO (rl/ppo_config.py; --config RECIPE.yaml sets any of them):",
        *(entry(n) for n in OWN_FIELDS), "",
        "inherited from transformers.TrainingArguments (these work; the others are refused):",
        *(entry(n) for n in inherited), "",
    ])


def parse_config(argv: list[str] | None = None, notes: Deprecations | None = None) -> StepPPOConfig:
    """StepPPOConfig from flags and `--config RECIPE.yaml` (TRL's parser), checked: ConfigError (one
    line) for an unknown flag or recipe key (with the closest name), an inherited flag step PPO does
    not use, a value of the wrong type, a missing recipe, a tracker that is not there or a bad value.
    Earlier setting names are taken: the deprecation lines are printed when the settings are good,
    unless the caller passes its own `notes` (rl/ppo_step.py checks its inputs first, then prints
    them); an error names a setting as the user wrote it."""
    own_notes = notes is None
    notes = Deprecations() if notes is None else notes
    try:
        config = _parse(argv, notes)
    except ConfigError as err:
        raise ConfigError(notes.in_users_words(str(err))) from None
    if own_notes:
        notes.print()
    return config


def _parse(argv: list[str] | None, notes: Deprecations) -> StepPPOConfig:
    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(help_text())
        raise SystemExit(0)
    argv, recipe_path = _pop_config(argv)
    argv = translate_argv(argv, notes)
    recipe = read_recipe(recipe_path, notes) if recipe_path else {}
    check_given_names(flag_names(argv), list(recipe))
    check_field_types(recipe)
    parser = _parser((StepPPOConfig,))
    try:
        unknown = parser.set_defaults_with_config(**recipe)
        if unknown:
            raise ConfigError(f"Unknown arguments from config file: {unknown}"
                              + _close(unknown[0].lstrip("-"), set(OWN_FIELDS) | INHERITED_IN_USE))
        (config,) = parser.parse_args_into_dataclasses(args=argv)
    except ConfigError:
        raise
    except (ValueError, TypeError, AttributeError, OSError, yaml.YAMLError) as err:
        raise ConfigError(" ".join(str(err).split()) or type(err).__name__) from None
    check_report_to(config.report_to)
    if config.push_to_hub and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise ConfigError("--push_to_hub needs the Hub, and HF_HUB_OFFLINE is set")
    return config  # the settings were checked when it was made (StepPPOConfig.validate)


def parse_with_ppo_settings(argv: list[str] | None, own: type | None, uses: frozenset[str], run: str, *,
                            required: tuple[str, ...] = (), defaults: dict[str, Any] | None = None,
                            check: Callable[[StepPPOConfig, Any], None] | None = None
                            ) -> tuple[StepPPOConfig, Any]:
    """The settings of a baseline trained beside PPO (rl/baselines/grpo_peer.py, rl/baselines/rft.py): the StepPPOConfig
    fields it shares with a PPO run (`uses`, TRL's names: their defaults are the PPO run's, written
    once, here) and its own dataclass `own` (None: it has none; then None comes back in its place).
    Earlier flag names are translated as parse_config translates them (a deprecation line each). A
    PPO flag outside `uses` is refused rather than silently ignored, and so is `--config` (a PPO
    recipe sets much the baseline would not use); `required` flags must be given; `defaults` are the
    few shared fields whose default the baseline sets otherwise (each a reason in its module);
    `check(config, own)` raises ConfigError for what the baseline cannot use, before the PPO run's own
    checks (whose messages speak of PPO). ConfigError (one line, in the names the user wrote)."""
    notes = Deprecations()
    try:
        parsed = _parse_baseline(argv, own, uses, run, required, defaults, check, notes)
    except ConfigError as err:
        raise ConfigError(notes.in_users_words(str(err))) from None
    notes.print()
    return parsed


def _parse_baseline(argv, own, uses, run, required, defaults, check, notes) -> tuple[StepPPOConfig, Any]:
    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(t == "--config" or t.startswith("--config=") for t in argv):
        raise ConfigError(f"{run} takes flags, not --config (a PPO recipe holds settings it does not use)")
    argv = translate_argv(argv, notes)
    types = (_Unchecked,) if own is None else (_Unchecked, own)
    own_fields = {f.name for f in fields(own)} if own else set()
    takes = set(uses) | own_fields
    ppo_fields = {f.name for f in fields(StepPPOConfig)}
    own_bools = {f.name for f in fields(own) if isinstance(f.default, bool)} if own else set()
    for name in flag_names(argv):
        name = name[3:] if name.startswith("no_") and name[3:] in own_bools else name
        if name not in ppo_fields | own_fields:
            earlier = {old for old, new in EARLIER_NAMES.items() if new in takes}
            match = difflib_match(name, takes | earlier)
            hint = f"; did you mean --{current_name(match)}?" if match else ""
            raise ConfigError(f"unknown flag --{name}{hint}")
    given = _flags_given(types, argv)
    unused = sorted((given & ppo_fields) - set(uses))
    if unused:
        raise ConfigError(f"{run} does not use --{unused[0]} (a PPO setting); it takes "
                          + ", ".join(f"--{name}" for name in sorted(takes)))
    missing = [name for name in required if name not in given]
    if missing:
        raise ConfigError(f"{run} needs --{missing[0]}")
    parser = _parser(types)
    if defaults:
        parser.set_defaults(**defaults)
    try:
        configs = parser.parse_args_into_dataclasses(args=argv)
    except ConfigError:
        raise
    except (ValueError, TypeError, AttributeError, OSError, yaml.YAMLError) as err:
        raise ConfigError(" ".join(str(err).split()) or type(err).__name__) from None
    config = configs[0]
    if check is not None:
        check(config, configs[1] if own else None)
    try:
        StepPPOConfig.validate(config)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return config, (configs[1] if own else None)


class _Unchecked(StepPPOConfig):
    """StepPPOConfig whose settings are checked by its maker, not when made: a baseline says what it
    cannot use in its own words before the PPO checks speak of PPO."""

    def validate(self) -> None:
        pass


def _flags_given(types: tuple[type, ...], argv: list[str]) -> set[str]:
    """The fields of `types` that `argv` sets (abbreviated flags and `--no_x` included)."""
    parser = _parser(types)
    unset = object()
    parser.set_defaults(**{f.name: unset for t in types for f in fields(t)})
    namespace, _ = parser.parse_known_args(argv)
    return {name for name, value in vars(namespace).items() if value is not unset and name != "help"}
