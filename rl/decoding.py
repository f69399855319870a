r"""A decoding loop over transformers' KV cache that drops rows as they end (`--hf_decoding loop`).

`model.generate` keeps every row of a batch in every decoding step until the last row ends: a row
that has sampled its EOS goes on being computed (and padded over) while the batch's longest row runs.
Rollouts and continuations from step boundaries end at very different lengths (a continuation from
a late boundary needs a few tokens, one from the prompt the whole response), so on the long setting
about half of `generate`'s decoding steps compute nothing kept (`continuations/fill` 0.42 to 0.58,
`docs/results/progress_rewards.md`). Here rows leave the batch, and their keys and values the cache,
as they sample their EOS or use their own budget. Ended rows are computed on (nothing of theirs
kept) until they are 1/DROP_SHARE of the batch, then dropped together, since each drop copies the
live rows' cache.

The rows' prefixes are encoded once per *source*: equal rows (a prompt's samples, a prefix's copies)
and rows that begin another (the boundaries of one response) are read from one encoding
(`nest`). At each step a row attends to its part of its source's keys and values and to its own
new tokens, computed apart and merged by their log-sum-exps (`SharedPrefix`): a source is read once
a step for all of its rows instead of once per row, and a row's own tokens need no padding. The
decoding steps run under this attention, registered with transformers' `AttentionInterface`; a
model whose attention does not dispatch through it, or that slides a window, is refused.

Sampling is `generate`'s: the same logits warpers (temperature, top-k, top-p) built by transformers'
own classes, softmax in float32 and one `torch.multinomial` draw per live row, or the argmax when
not sampling. Positions are counted from
each row's first real token, as `generate` counts them from the attention mask. Greedy rows are
`generate`'s token for token (up to float rounding in the merged attention); sampled rows of distinct
prefixes are too under the same seed until the first row ends (after it, fewer rows draw, so the
later draws differ; each row is still sampled from the same distribution).
A model whose generation config asks for more than these warpers (a repetition penalty, banned
n-grams, a minimum length, ...) is refused with the field named: use `--hf_decoding generate` for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch

HF_DECODING = ("generate", "loop")
"""--hf_decoding: transformers' `generate`, or this module's loop that drops rows as they end."""

DROP_SHARE = 8
"""Ended rows are dropped (their cache rows copied out) once they are 1/DROP_SHARE of the batch, not
one by one: dropping copies every live row's keys and values, which costs about what decoding 30
rows for a step does on the long setting, while an ended row kept costs one row's step."""

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


def nest(heads: Sequence[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """Distinct token sequences grouped into sources: a sequence that begins another is read from it.
    Returns the sources (each the longest of its chain) and the source of each sequence. Sorted,
    every sequence that begins with `h` directly follows `h`, so one pass from the end finds them."""
    order = sorted(range(len(heads)), key=lambda i: heads[i])
    sources: list[tuple[int, ...]] = []
    source_of = [0] * len(heads)
    for i in reversed(order):
        if not (sources and sources[-1][: len(heads[i])] == heads[i]):
            sources.append(heads[i])
        source_of[i] = len(sources) - 1
    return sources, source_of


class SharedPrefix:
    """The keys and values of a batch's sources (`nest`), encoded once, and which rows read which part:
    row b attends to the first `cut[b]` tokens of source `group[b]` and to its own new tokens (in the
    cache the model updates). Attention over the two parts is computed apart and merged by their
    log-sum-exps, so each source's keys and values are read once a step for all of its rows (a prompt's
    samples, a prefix's copies, the boundaries of one response) instead of once per row."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], pads: torch.Tensor, group: torch.Tensor,
                 cut: torch.Tensor, rep: int) -> None:
        self.keys, self.values = [k for k, _ in layers], [v for _, v in layers]
        self.pads, self.group, self.cut, self.rep, self.calls = pads, group, cut, rep, 0
        self.arrange()

    def arrange(self) -> None:
        """Each row's slot in a [sources, width] grid of queries, and the grid's mask over the sources'
        positions; sources no row reads any more are dropped."""
        used, group = torch.unique(self.group, return_inverse=True)
        if used.numel() < self.keys[0].shape[0]:
            self.keys = [k.index_select(0, used) for k in self.keys]
            self.values = [v.index_select(0, used) for v in self.values]
            self.pads = self.pads[used]
        self.group = group
        order = torch.argsort(group, stable=True)  # a row's place among its source's rows, in row order
        counts = torch.bincount(group, minlength=int(used.numel()))
        first = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(group)
        rank[order] = torch.arange(group.numel(), device=group.device) - first[group[order]]
        self.width = int(rank.max()) + 1
        self.slot = group * self.width + rank
        span = self.keys[0].shape[2]
        start = torch.full((used.numel() * self.width,), span - 1, device=group.device)  # empty slots: one position
        end = torch.full_like(start, span)
        start[self.slot], end[self.slot] = self.pads[group], self.pads[group] + self.cut
        column = torch.arange(span, device=group.device)
        allowed = (column[None, :] >= start[:, None]) & (column[None, :] < end[:, None])
        mask = torch.zeros(allowed.shape, dtype=self.keys[0].dtype, device=group.device)
        mask = mask.masked_fill(~allowed, float("-inf")).view(used.numel(), 1, self.width, span)
        self.mask = mask.repeat_interleave(self.rep, dim=2)

    def keep(self, rows: torch.Tensor) -> None:
        self.group, self.cut = self.group[rows], self.cut[rows]
        self.arrange()

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
               ) -> torch.Tensor:
        """Attention output [B, 1, H, D] of one new token a row (`query` [B, H, 1, D]) over its source's
        prefix and its own new tokens (`key`, `value` [B, Hkv, T, D])."""
        self.calls += 1
        rows, heads, _, dim = query.shape
        kv_heads, rep = key.shape[1], heads // key.shape[1]
        prefix_k, prefix_v = self.keys[layer], self.values[layer]
        groups = prefix_k.shape[0]
        grid = query.new_zeros((groups * self.width, heads, dim))
        grid[self.slot] = query[:, :, 0]
        grid = grid.view(groups, self.width, kv_heads, rep, dim).transpose(1, 2).reshape(groups, kv_heads, -1, dim)
        out_p, lse_p = _attention(grid, prefix_k, prefix_v, self.mask, scale)
        out_p = out_p.view(groups, kv_heads, self.width, rep, dim).transpose(1, 2).reshape(-1, heads, dim)[self.slot]
        lse_p = lse_p.view(groups, kv_heads, self.width, rep).transpose(1, 2).reshape(-1, heads)[self.slot]
        out_s, lse_s = _attention(query.reshape(rows, kv_heads, rep, dim), key, value, None, scale)
        out_s, lse_s = out_s.reshape(rows, heads, dim), lse_s.reshape(rows, heads)
        lse = torch.logaddexp(lse_p, lse_s)
        out = out_p * torch.exp(lse_p - lse)[..., None] + out_s * torch.exp(lse_s - lse)[..., None]
        return out[:, None].to(query.dtype)


def _attention(query, key, value, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of `query` [N, Hkv, Q, D] over `key`, `value` [N, Hkv, K, D] under an additive
    `mask` [N, 1, Q, K] (or none): the output [N, Hkv, Q, D] and each query's log-sum-exp [N, Hkv, Q]
    (float32). On CPU, PyTorch's flash kernel; elsewhere the same in plain operations. Under autocast
    the inputs are cast to its dtype, as autocast casts `scaled_dot_product_attention`'s (rotary
    embeddings leave queries and keys in float32 beside bf16 values)."""
    kind = query.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    mask = mask.to(dtype) if mask is not None else None
    if kind == "cpu" and not EAGER_ATTENTION:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, attn_mask=mask,
                                                                                scale=scale)
        return out, lse.float()
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value.float()).to(query.dtype), lse


EAGER_ATTENTION = False
"""True: the loop's attention in plain operations on CPU too (the path other devices take; tests)."""

_NAME = "steprl_shared_prefix"


def _shared_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function the loop's decoding steps run under (registered with transformers'
    AttentionInterface): `kwargs['shared_prefix']` holds the sources' keys and values."""
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"--hf_decoding loop does not apply {name} attention: use --hf_decoding generate")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kwargs["shared_prefix"].attend(module.layer_idx, query, key, value, scale), None


@contextmanager
def _shared_prefix_attention_on(model):
    from transformers import AttentionInterface

    if _NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(_NAME, _shared_prefix_attention)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = _NAME
    try:
        yield
    finally:
        config._attn_implementation = before


@contextmanager
def _logits_at(model, rows: torch.Tensor, positions: torch.Tensor):
    """The model's output layer applied to the final hidden states at (`rows[i]`, `positions[i]`) only,
    its logits [1, N, vocab]: a source's every position through a real vocabulary (49k for SmolLM2)
    would take gigabytes for a chunk of 512 rows."""
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda module, args: (args[0][rows, positions][None], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from its row's first real token (as `generate` counts them)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) [B, H, L, D] of every layer of a transformers cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(cache.key_cache[i], cache.value_cache[i]) for i in range(len(cache.key_cache))]  # pragma: no cover


@torch.no_grad()
def encode_sources(model, sources: Sequence[Sequence[int]], pad_id: int, device,
                   logits_at: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """One forward over the sources, left-padded: every layer's keys and values [S, H, L, D], each
    source's padding on the left [S], and logits [N, vocab]: given `logits_at` (source rows, token
    indices counted in each source), at those tokens only; else at each source's last token."""
    ids, mask = left_padded(sources, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    pads = mask.shape[1] - mask.sum(-1)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True)
    if logits_at is None:
        out = model(**inputs, logits_to_keep=1)
        return cache_layers(out.past_key_values), pads, out.logits[:, -1]
    rows, at = logits_at
    with _logits_at(model, rows, pads[rows] + at):
        out = model(**inputs)
    return cache_layers(out.past_key_values), pads, out.logits[0]


def _encode(model, heads: list[tuple[int, ...]], pad_id: int, device) -> tuple[SharedPrefix, torch.Tensor]:
    """The rows' sources (`nest`) encoded in one forward, and each row's first logits (at its last
    prefix token)."""
    distinct = list(dict.fromkeys(heads))
    sources, source_of = nest(distinct)
    index = {h: i for i, h in enumerate(distinct)}
    group = torch.tensor([source_of[index[h]] for h in heads], device=device)
    cut = torch.tensor([len(h) for h in heads], device=device)
    layers, pads, logits = encode_sources(model, sources, pad_id, device, logits_at=(group, cut - 1))
    config = model.config
    rep = config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    return SharedPrefix(layers, pads, group, cut, rep), logits


@torch.no_grad()
def decode(model, ids: torch.Tensor, mask: torch.Tensor, budgets: Sequence[int], generate_kwargs: dict[str, Any],
           eos_id: int | None = None) -> tuple[list[list[int]], int]:
    """The new tokens of each row of a left-padded batch (`ids`, `mask` [B, W]), at most `budgets[b]`
    of them, up to and with the first EOS; and the decoding steps computed (rows summed over steps,
    ended ones not yet dropped among them). Rows leave the batch (their cache rows dropped) as they
    end, once they are 1/DROP_SHARE of it. The rows' prefixes are encoded once per source (`nest`)
    and read once a step per source (`SharedPrefix`)."""
    check_generation_config(model)
    out: list[list[int]] = [[] for _ in range(ids.shape[0])]
    budget = torch.tensor([int(b) for b in budgets], device=ids.device)
    live = torch.nonzero(budget > 0).flatten()
    if live.numel() == 0:
        return out, 0
    heads = [tuple(ids[b][mask[b].bool()].tolist()) for b in live.tolist()]
    prefix, logits = _encode(model, heads, int(generate_kwargs.get("pad_token_id") or 0), ids.device)
    sample, processors = bool(generate_kwargs.get("do_sample")), warpers(generate_kwargs)
    eos = torch.tensor(_eos_ids(generate_kwargs, eos_id), device=ids.device, dtype=torch.long)
    seen = ids[live]  # what the warpers are given as the sequence so far (none of them reads it)
    cache = _growing_cache(min(int(budget[live].max()), 32))  # the new tokens: room for 32, doubled as needed
    position = prefix.cut.clone()
    alive = torch.ones(live.numel(), dtype=torch.bool, device=ids.device)
    steps = used = 0
    with _shared_prefix_attention_on(model):
        while True:
            at = torch.nonzero(alive).flatten()
            every = bool(at.numel() == alive.numel())
            scores = (logits if every else logits[at]).to(dtype=torch.float32)
            for warp in processors:
                scores = warp(seen if every else seen[at], scores)
            if sample:
                drawn = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            else:
                drawn = torch.argmax(scores, dim=-1)
            steps += int(alive.numel())
            used += 1
            for row, tok in zip(live[at].tolist(), drawn.tolist()):
                out[row].append(tok)
            token = drawn if every else torch.zeros_like(live).index_put_((at,), drawn)
            alive[at] = ~(torch.isin(drawn, eos) | (budget[live[at]] <= used))
            if not bool(alive.any()):
                return out, steps
            if int((~alive).sum()) >= max(1, alive.numel() // DROP_SHARE):
                keep = torch.nonzero(alive).flatten()  # drop the ended rows and their cache rows
                live, token, position, seen, alive = live[keep], token[keep], position[keep], seen[keep], alive[keep]
                cache.batch_select_indices(keep)
                prefix.keep(keep)
            logits = model(input_ids=token[:, None], position_ids=position[:, None], past_key_values=cache,
                           use_cache=True, shared_prefix=prefix).logits[:, -1, :]
            position = position + 1
            if prefix.calls == 0:
                raise ValueError("--hf_decoding loop needs a model whose attention dispatches through transformers' "
                                 "AttentionInterface: use --hf_decoding generate")


def left_padded(heads: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as a left-padded batch and its attention mask, as the rollouts' prompts are."""
    width = max(len(h) for h in heads)
    ids = torch.full((len(heads), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(heads), width), dtype=torch.long)
    for at, head in enumerate(heads):
        ids[at, width - len(head) :] = torch.tensor(list(head), dtype=torch.long)
        mask[at, width - len(head) :] = 1
    return ids, mask
