"""Which prompts fit a model's context: the one check of evaluation (`Tracker`), PPO's prompt sets,
annotation rollouts and the completion server.

A prompt fits when its tokens plus `max_new_tokens` are at most the context. Counting the tokens of
a huge prompt costs seconds of CPU (2 MB: about 3 s), so a prompt longer than the context can hold
in characters is refused without being tokenised: no token covers more characters than the
longest entry of the tokenizer's vocabulary (`max_token_chars`), so a prompt of more than
`(context - max_new_tokens) * max_token_chars` characters cannot fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

PROMPT_TOO_LONG = "prompt_too_long"
"""The flag (and count name) of a prompt that does not fit the context."""


def max_token_chars(tokenizer) -> int | None:
    """The most characters of text one token of `tokenizer` stands for: its longest vocabulary entry
    (byte-level entries spell one byte per character, and a byte is at most one character). None
    when the tokenizer lists no vocabulary."""
    cached = getattr(tokenizer, "_steprl_max_token_chars", None)
    if cached is not None:
        return cached
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    longest = max((len(t) for t in vocab if isinstance(t, str)), default=0) or None
    try:
        tokenizer._steprl_max_token_chars = longest
    except AttributeError:  # a tokenizer that takes no new attribute: computed again next time
        pass
    return longest


def max_prompt_chars(context: int, max_new_tokens: int, token_chars: int | None) -> int | None:
    """The most characters a prompt can have and still fit; None when no bound is known."""
    if token_chars is None:
        return None
    return max(0, context - max_new_tokens) * token_chars


def prompts_fit(prompts: Sequence[str], context: int | None, max_new_tokens: int,
                count_tokens: Callable[[list[str]], list[int]], token_chars: int | None = None) -> list[bool]:
    """For each prompt, whether it fits `context` tokens with `max_new_tokens` new ones; all of them
    when `context` is None. Prompts beyond `max_prompt_chars` are refused without being counted."""
    if not context:
        return [True] * len(prompts)
    bound = max_prompt_chars(context, max_new_tokens, token_chars)
    short = [bound is None or len(p) <= bound for p in prompts]
    counts = iter(count_tokens([p for p, ok in zip(prompts, short) if ok]) if any(short) else [])
    return [ok and next(counts) + max_new_tokens <= context for ok in short]


def context_of(config) -> int | None:
    """The most tokens (prompt and completion) a model takes, from its config; None when the
    config states none."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
