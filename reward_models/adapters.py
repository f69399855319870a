"""Moved to `reward_models.step_tag_prms`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("reward_models.adapters", "reward_models.step_tag_prms")
