r"""A decoding loop over transformers' KV cache that drops rows as they end (`--hf_decoding loop`).

`model.generate` keeps every row of a batch in every decoding step until the last row ends: a row
that has sampled its EOS goes on being computed (and padded over) while the batch's longest row runs.
Rollouts and continuations from step boundaries end at very different lengths (a continuation from
a late boundary needs a few tokens, one from the prompt the whole response), so on the long setting
about half of `generate`'s decoding steps compute nothing kept (`continuations/fill` 0.42 to 0.58,
`docs/results/progress_rewards.md`). Here a row leaves the batch, and its keys and values the cache,
the step it samples its EOS or uses its own budget, so each step costs what its live rows cost.

Equal rows of a batch (a prompt's samples, the copies of a prefix) are encoded once and their keys
and values repeated. Sampling is `generate`'s: the same logits warpers (temperature, top-k, top-p)
built by transformers' own classes, softmax in float32 and one `torch.multinomial` draw per live
row, or the argmax when not sampling. Positions are counted from each row's first real token, as
`generate` counts them from the attention mask. Greedy rows are `generate`'s token for token;
sampled rows of distinct prefixes are too under the same seed until the first row leaves (after it,
fewer rows draw, so the later draws differ; each row is still sampled from the same distribution).
A model whose generation config asks for more than these warpers (a repetition penalty, banned
n-grams, a minimum length, ...) is refused with the field named: use `--hf_decoding generate` for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

HF_DECODING = ("generate", "loop")
"""--hf_decoding: transformers' `generate`, or this module's loop that drops rows as they end."""

_PLAIN = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
          "min_length": 0, "min_new_tokens": None, "bad_words_ids": None, "suppress_tokens": None,
          "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
          "sequence_bias": None, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "typical_p": 1.0, "min_p": None,
          "num_beams": 1, "diversity_penalty": 0.0, "exponential_decay_length_penalty": None}
"""Generation-config fields this loop does not apply, with the values under which they do nothing."""


def check_generation_config(model) -> None:
    """ValueError (one line, naming the field) when the model's generation config sets something the
    loop would not apply, so that it never samples from another distribution than `generate`."""
    config = getattr(model, "generation_config", None)
    for name, plain in _PLAIN.items():
        value = getattr(config, name, plain)
        if value not in (plain, None) and not (plain is None and value in ([], 0)):
            raise ValueError(f"--hf_decoding loop does not apply the model's generation config {name}={value!r}: "
                             "use --hf_decoding generate")


def warpers(generate_kwargs: dict[str, Any]) -> list[Any]:
    """transformers' logits warpers for `generate_kwargs` in `generate`'s order: temperature, top-k,
    top-p (none when not sampling)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if not generate_kwargs.get("do_sample"):
        return []
    out: list[Any] = []
    temperature = generate_kwargs.get("temperature", 1.0)
    if temperature is not None and temperature != 1.0:
        out.append(TemperatureLogitsWarper(float(temperature)))
    top_k = generate_kwargs.get("top_k") or 0
    if top_k > 0:
        out.append(TopKLogitsWarper(int(top_k)))
    top_p = generate_kwargs.get("top_p", 1.0)
    if top_p is not None and top_p < 1.0:
        out.append(TopPLogitsWarper(float(top_p)))
    return out


def _growing_cache(reserve: int):
    """A transformers `DynamicCache` whose layers keep their keys and values in buffers with room for
    `reserve` more positions, written in place, instead of `torch.cat`-ing the whole cache at every
    step (a copy of every row's keys and values per step and layer: a quarter of a CPU decoding step
    here). `keys` / `values` are views of the filled part, so the model attends over exactly the
    tokens it has; a buffer that fills up doubles, and dropping rows copies the filled part only.
    A small room (32 positions) beats the whole budget: most rows end long before it, and every
    dropped row would otherwise copy room it never used."""
    from functools import partial

    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        def __init__(self, room: int) -> None:
            super().__init__()
            self.room, self.filled = room, 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.key_buffer = key_states[:, :, :0]
                self.value_buffer = value_states[:, :, :0]
            new = key_states.shape[-2]
            if self.filled + new > self.key_buffer.shape[-2]:
                size = max(self.filled + new + self.room, 2 * self.key_buffer.shape[-2])
                self.key_buffer = self._moved(self.key_buffer, key_states, size)
                self.value_buffer = self._moved(self.value_buffer, value_states, size)
            self.key_buffer[:, :, self.filled : self.filled + new] = key_states
            self.value_buffer[:, :, self.filled : self.filled + new] = value_states
            self.filled += new
            self.keys = self.key_buffer[:, :, : self.filled]
            self.values = self.value_buffer[:, :, : self.filled]
            return self.keys, self.values

        def _moved(self, old, like, size):
            out = like.new_empty((like.shape[0], like.shape[1], size, like.shape[3]))
            if self.filled:
                out[:, :, : self.filled] = old[:, :, : self.filled]
            return out

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.filled:  # the filled part only, into buffers of the same room
                for name in ("key_buffer", "value_buffer"):
                    old = getattr(self, name)
                    new = old.new_empty((indices.numel(), *old.shape[1:]))
                    torch.index_select(old[:, :, : self.filled], 0, indices, out=new[:, :, : self.filled])
                    setattr(self, name, new)
                self.keys = self.key_buffer[:, :, : self.filled]
                self.values = self.value_buffer[:, :, : self.filled]

    cache = DynamicCache()
    cache.layer_class_to_replicate = partial(GrowingLayer, reserve)
    return cache


def _eos_ids(generate_kwargs: dict[str, Any], eos_id: int | None) -> list[int]:
    given = generate_kwargs.get("eos_token_id", eos_id)
    if given is None:
        return []
    return [int(t) for t in (given if isinstance(given, (list, tuple)) else [given])]


@torch.no_grad()
def decode(model, ids: torch.Tensor, mask: torch.Tensor, budgets: Sequence[int], generate_kwargs: dict[str, Any],
           eos_id: int | None = None) -> tuple[list[list[int]], int]:
    """The new tokens of each row of a left-padded batch (`ids`, `mask` [B, W]), at most `budgets[b]`
    of them, up to and with the first EOS; and the decoding steps computed (live rows summed over
    steps). A row leaves the batch (its cache rows dropped) the step it ends."""
    check_generation_config(model)
    rows = ids.shape[0]
    out: list[list[int]] = [[] for _ in range(rows)]
    budget = torch.tensor([int(b) for b in budgets], device=ids.device)
    live = torch.nonzero(budget > 0).flatten()
    if live.numel() == 0:
        return out, 0
    ids, mask = ids[live], mask[live]
    sample, processors = bool(generate_kwargs.get("do_sample")), warpers(generate_kwargs)
    eos = torch.tensor(_eos_ids(generate_kwargs, eos_id), device=ids.device, dtype=torch.long)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = _growing_cache(min(int(budget[live].max()), 32))  # room for 32 tokens, doubled as needed
    # equal rows (a prompt's samples, a prefix's copies) are encoded once, their cache rows then repeated
    distinct, of_row = torch.unique(torch.cat([ids, mask.to(ids.dtype)], dim=1), dim=0, return_inverse=True)
    once = distinct.shape[0] < ids.shape[0]
    encoded = distinct.split(ids.shape[1], dim=1) if once else (ids, mask)
    logits = model(input_ids=encoded[0], attention_mask=encoded[1], position_ids=(encoded[1].long().cumsum(-1) - 1)
                   .clamp(min=0), past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
    if once:
        logits = logits[of_row]
        cache.batch_select_indices(of_row)
    seen = ids  # what the warpers see as the sequence so far (none of them reads it)
    position = positions[:, -1]
    steps = used = 0
    while True:
        scores = logits.to(dtype=torch.float32)
        for warp in processors:
            scores = warp(seen, scores)
        if sample:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = torch.argmax(scores, dim=-1)
        steps += int(live.numel())
        used += 1
        for row, tok in zip(live.tolist(), token.tolist()):
            out[row].append(tok)
        ended = torch.isin(token, eos) | (budget[live] <= used)
        if bool(ended.all()):
            return out, steps
        if bool(ended.any()):
            keep = torch.nonzero(~ended).flatten()
            live, token, mask, position, seen = live[keep], token[keep], mask[keep], position[keep], seen[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        position = position + 1
        seen = torch.cat([seen, token[:, None]], dim=1)
        logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position[:, None],
                       past_key_values=cache, use_cache=True).logits[:, -1, :]


def left_padded(heads: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as a left-padded batch and its attention mask, as the rollouts' prompts are."""
    width = max(len(h) for h in heads)
    ids = torch.full((len(heads), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(heads), width), dtype=torch.long)
    for at, head in enumerate(heads):
        ids[at, width - len(head) :] = torch.tensor(list(head), dtype=torch.long)
        mask[at, width - len(head) :] = 1
    return ids, mask
