"""Moved to `reward_models.verifier_metrics`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("reward_models.evaluate", "reward_models.verifier_metrics")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
