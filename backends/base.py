"""The `Generator` interface shared by annotation rollouts, PPO evaluation and inference methods."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass
class Completion:
    text: str
    """Generated text, without the prompt, cut after the first stop string (which is kept)."""
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    """'stop' (EOS or a stop string) or 'length' (hit max_new_tokens)."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 192
    temperature: float = 0.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    n: int = 1
    """Completions per prompt."""
    stop: tuple[str, ...] = ()
    """Generation of a completion ends after the first of these strings."""
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        self.stop = tuple(self.stop)


class Generator(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions for each prompt, in prompt order."""
        ...


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Text up to and including the earliest stop string, and whether one was found."""
    best = None
    for s in stop:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best):
            best = i + len(s)
    return (text, False) if best is None else (text[:best], True)
