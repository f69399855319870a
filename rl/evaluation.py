"""Moved to `rl.greedy_accuracy`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("rl.evaluation", "rl.greedy_accuracy")
