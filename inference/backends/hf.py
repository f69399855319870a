"""Moved to `backends.hf` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.hf", "backends.hf")
