"""Moved to `rl.tools.gguf_convert`; this path forwards to it for one release."""

from reasoning.moved import forward

_module, __getattr__ = forward("rl.gguf_convert", "rl.tools.gguf_convert")

if __name__ == "__main__":
    import sys

    sys.exit(_module.main())
