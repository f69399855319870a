"""Moved to `backends.vllm` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.vllm", "backends.vllm")
