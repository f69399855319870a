"""The generator backends' old home, kept for one release: they are the bottom package `backends`
now (`reward_models`, `rl` and `inference` all import it; nothing below imports upward).

`import inference.backends.hf` and `python -m inference.backends.serve` still work, each with one
FutureWarning line naming the new path; every name is the new module's own object.
"""

from backends import GENERATOR_KINDS, make_generator
from reasoning.moved import warn_moved

warn_moved("inference.backends", "backends")

__all__ = ["GENERATOR_KINDS", "make_generator"]
