"""Moved to `rl.baselines.rft`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("rl.rft", "rl.baselines.rft")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
