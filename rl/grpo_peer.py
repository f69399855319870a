"""Moved to `rl.baselines.grpo_peer`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("rl.grpo_peer", "rl.baselines.grpo_peer")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
