"""Moved to `backends.model_files` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.model_files", "backends.model_files")
