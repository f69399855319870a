"""Moved to `rl.tools.checkpoint_curve`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("rl.checkpoint_curve", "rl.tools.checkpoint_curve")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
