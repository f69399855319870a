"""Moved to `backends.serve` (the bottom package); this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("inference.backends.serve", "backends.serve")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
