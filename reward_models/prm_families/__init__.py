"""Published PRM families, one module each, behind the one `Verifier` interface.

A family is how a published process reward model is meant to be read, as its model card's own
scoring code reads it: how its weights load (the architecture and head, refused when the weights do
not fill the head), how a question and its steps are rendered for it (chat template, separator
token), and where and how each step's score is read from its outputs. Each module of this package
defines `FAMILY` (a `reward_models.prm_families.base.PRMFamily`) and its module name, with `_` read
as `-`, is the spec prefix a user types (`qwen_prm.py` is `qwen-prm:PATH`): adding a family is adding
one file. `auto:PATH` picks the family from the checkpoint's config.json and tokenizer files.

This file imports nothing heavy: the names are listed from the package's files, and a family's
module (torch, transformers) is imported only when a spec names it.
"""

from __future__ import annotations

import importlib
import pkgutil


def family_names() -> tuple[str, ...]:
    """The spec prefixes of the families in this package, from its module names."""
    return tuple(sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__)
                        if not m.name.startswith("_") and m.name != "base"))


FAMILY_NAMES = family_names()


def get_family(name: str):
    """The `PRMFamily` registered under spec prefix `name` (ValueError naming the known ones)."""
    if name not in FAMILY_NAMES:
        raise ValueError(f"no PRM family {name!r}; known: {', '.join(FAMILY_NAMES)}")
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}").FAMILY
