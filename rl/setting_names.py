"""The earlier names of step PPO's settings, translated once, at the edge.

Step PPO's settings take TRL's names (`GRPOConfig`'s: `num_generations`, `beta`, ...). Commands,
YAML recipes, compare configs and run folders written before that still say `--num_updates` or
`kl_coef:`; they are translated here, where they enter (the command-line parser, a recipe, a compare
config, a stored `run_config.json`), and every module after the edge reads TRL's names only.

    translated = translate_settings(values, notes, where="recipe.yaml: ")
    argv = translate_argv(argv, notes)
    notes.print()          # one deprecation line per earlier name met
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

from rl.ppo_config import ConfigError

EARLIER_NAMES = {
    "policy": "model_name_or_path",
    "num_updates": "max_steps",
    "samples_per_prompt": "num_generations",
    "max_new_tokens": "max_completion_length",
    "ppo_epochs": "num_iterations",
    "cliprange": "epsilon",
    "kl_coef": "beta",
    "rollout_backend": "use_vllm",
}
"""Earlier name of a step PPO setting -> the name TRL's GRPOConfig gives the same setting."""


@dataclass
class Deprecations:
    """The earlier names a parse met, as (where, name): `where` is "--" for a flag and "PATH: " for
    a key of the file at PATH. Printed once the parse has succeeded (a failed parse reports its
    error alone, in the names the user wrote)."""

    met: list[tuple[str, str]] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        return {name for _, name in self.met}

    def print(self, file=None) -> None:
        for where, old in self.met:
            dash = "--" if where == "--" else ""
            print(f"warning: {where}{old} is deprecated: use {dash}{EARLIER_NAMES[old]} (TRL's name)",
                  file=file or sys.stderr)

    def in_users_words(self, message: str) -> str:
        """`message` with each setting the user gave under an earlier name named that way."""
        for old in self.names:
            if old == "rollout_backend":
                message = message.replace("--use_vllm false", "--rollout_backend hf")
                message = message.replace("--use_vllm true", "--rollout_backend vllm")
            message = re.sub(rf"--{EARLIER_NAMES[old]}\b", f"--{old}", message)
        return message


def use_vllm_of(value: Any) -> bool:
    """The earlier `rollout_backend` (hf / vllm) as the value of `use_vllm`."""
    if value in ("hf", "vllm"):
        return value == "vllm"
    raise ConfigError(f"--rollout_backend must be hf or vllm, got {value!r} (it is now --use_vllm true/false)")


def translate_settings(values: dict[str, Any], notes: Deprecations | None = None,
                       where: str = "") -> dict[str, Any]:
    """`values` (setting -> value) under TRL's names. Each earlier name met is noted in `notes`
    (None: translated silently, as for a stored run folder); ConfigError when both names are given."""
    out = dict(values)
    for old, new in EARLIER_NAMES.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"{where}{old} and {new} are the same setting ({new} is TRL's name): give one")
        value = out.pop(old)
        out[new] = use_vllm_of(value) if old == "rollout_backend" else value
        if notes is not None:
            notes.met.append((where, old))
    return out


def translate_argv(argv: list[str], notes: Deprecations) -> list[str]:
    """A command line with each flag of an earlier name replaced by TRL's (noted in `notes`). Flags
    keep their places: of an earlier and a current name, the later one wins, as argparse's would."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if name not in EARLIER_NAMES:
            out.append(token)
            i += 1
            continue
        notes.met.append(("--", name))
        new = EARLIER_NAMES[name]
        if name == "rollout_backend":
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError("--rollout_backend needs a value (hf or vllm)")
                value, i = argv[i + 1], i + 1
            out.append(f"--{new}={'true' if use_vllm_of(value) else 'false'}")
        else:
            out.append(f"--{new}{eq}{value}")
        i += 1
    return out


def current_name(name: str) -> str:
    """A setting's name under TRL's naming (an earlier name translated, any other unchanged)."""
    return EARLIER_NAMES.get(name, name)
