"""Moved to `backends.openai_compat` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.openai_compat", "backends.openai_compat")
