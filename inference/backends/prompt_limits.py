"""Moved to `backends.prompt_limits` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.prompt_limits", "backends.prompt_limits")
