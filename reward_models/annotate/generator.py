"""The policy as a generator that loads its weights on the first generate call, so that a finished
(resumed) run never loads them; its tokenizer alone serves the context check."""

from __future__ import annotations

from backends.base import Completion, SamplingParams


class LazyHFGenerator:
    """The policy through the `hf` backend, loaded on the first generate call (a finished run never
    loads it)."""

    def __init__(self, path: str, batch_size: int, chat_template: bool = True):
        self.path, self.batch_size, self.chat_template = path, batch_size, chat_template
        self._generator = None
        self._tokenizer = None

    def _tok(self):
        """The policy's tokenizer alone (no weights), for the context check before any generation."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        return self._tokenizer

    @property
    def context_length(self) -> int | None:
        from transformers import AutoConfig

        from backends.prompt_limits import context_of

        return context_of(AutoConfig.from_pretrained(self.path))

    @property
    def max_token_chars(self) -> int | None:
        from backends.prompt_limits import max_token_chars

        return max_token_chars(self._tok())

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._tok()(list(texts), add_special_tokens=False)["input_ids"]]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if self._generator is None:
            from backends.hf import HFGenerator

            self._generator = HFGenerator.from_pretrained(self.path, batch_size=self.batch_size,
                                                          chat_template=self.chat_template)
        return self._generator.generate(prompts, params)
