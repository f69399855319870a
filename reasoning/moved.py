"""Modules that moved keep their old path for one release: the deprecation line, and the
module-level name lookup that forwards to the new home (private names included), so old imports get
the very same objects."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any


def warn_moved(old: str, new: str) -> None:
    """One FutureWarning line naming the new path."""
    warnings.warn(f"{old} moved to {new}; import {new} (the old path goes in the next release)", FutureWarning,
                  stacklevel=3)


def forward(old: str, new: str) -> tuple[ModuleType, Any]:
    """The new module, and a module `__getattr__` for the old one that reads every name from it."""
    warn_moved(old, new)
    module = importlib.import_module(new)

    def __getattr__(name: str) -> Any:
        return getattr(module, name)

    return module, __getattr__
