"""`make_generator(kind, model, **opts)`: one way for every CLI to build a `Generator`.

    make_generator("hf", "outputs/sft_tiny", batch_size=64, device="cpu")
    make_generator("vllm", "Qwen/Qwen2.5-Math-7B", gpu_memory_utilization=0.8, enforce_eager=True)
    make_generator("openai", "outputs/sft_tiny", base_url="http://127.0.0.1:8000/v1", max_concurrency=16)

For `openai`, `model` is the served model name and the options are `OpenAICompatConfig`'s fields.
Backends are imported only when asked for, so importing this module is cheap.
"""

from __future__ import annotations

from typing import Any

from backends.base import Generator

GENERATOR_KINDS = ("hf", "vllm", "openai")


def make_generator(kind: str, model: str, **opts: Any) -> Generator:
    """A generator of `kind` (hf | vllm | openai) for `model` (a path, a Hub id, or a served name)."""
    if kind == "hf":
        from backends.hf import HFGenerator

        return HFGenerator.from_pretrained(model, **opts)
    if kind == "vllm":
        from backends.vllm import VLLMGenerator

        return VLLMGenerator(model, **opts)
    if kind == "openai":
        from backends.openai_compat import OpenAICompatGenerator

        return OpenAICompatGenerator(model=model, **opts)
    raise ValueError(f"generator kind must be one of {', '.join(GENERATOR_KINDS)}; got {kind!r}")
