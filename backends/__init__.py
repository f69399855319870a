"""Generator backends: `hf` (transformers), `vllm` (vLLM's offline engine), `openai` (any
OpenAI-compatible server; `python -m backends.serve` is one). Imports only `reasoning`.

`make_generator(kind, model, **opts)` builds any of them; the backends themselves are imported
only when used, so importing this package stays light.
"""

from backends.factory import GENERATOR_KINDS, make_generator

__all__ = ["GENERATOR_KINDS", "make_generator"]
