r"""Continuations from step boundaries, batched with shared prefixes (`--continuation_sampling shared`).

Monte Carlo step values (`--advantage_estimator mc_values`) and progress rewards (`--reward progress`)
sample `m` continuations from every step boundary inside every response of an update. Sampled one
prefix at a time, each of those continuations re-encodes its prompt and response head in `generate`'s
first forward, and identical prefixes (samples of one prompt often open with the same steps) are
sampled again and again. Here:

- **identical prefixes are continued once**: requests whose prefix tokens are equal share their `m`
  continuations (each is an estimate of the same value);
- **each response is encoded once**: one forward over the prompt and response up to its last boundary
  gives the keys and values of every prefix of it; a continuation row gets its prefix's slice of them
  as its KV cache (right-aligned, left-padded as `generate`'s prompts are), so `generate` computes only
  the last prefix token and the new ones;
- **rows are batched by response**: the responses of a chunk contribute all their rows, up to
  `batch_size` rows per `generate` call.

Sampling is `generate`'s own (the same logits processors, temperature and top-p as the rollouts);
only the prefix's encoding is reused. Positions are counted from each row's first real token, as
`generate` counts them from the attention mask, so a cached key is the key `generate` would compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl.decoding import decode, encode_sources, left_padded, nest


@dataclass(frozen=True)
class Plan:
    """Which requests share a prefix: `unique[u]` = (source, cut) of the u-th distinct prefix,
    `of_request[r]` = the distinct prefix request r continues."""

    unique: list[tuple[int, int]]
    of_request: list[int]


def plan(sources: Sequence[Sequence[int]], requests: Sequence[tuple[int, int]]) -> Plan:
    """Requests (source index, prefix length in tokens) grouped by their prefix tokens: equal
    prefixes, whichever source they are cut from, are one distinct prefix."""
    seen: dict[tuple[int, ...], int] = {}
    unique: list[tuple[int, int]] = []
    of_request = []
    for source, cut in requests:
        if not 1 <= cut <= len(sources[source]):
            raise ValueError(f"a prefix of {cut} tokens cut from a source of {len(sources[source])}")
        key = tuple(sources[source][:cut])
        if key not in seen:
            seen[key] = len(unique)
            unique.append((source, cut))
        of_request.append(seen[key])
    return Plan(unique, of_request)


def chunks(unique: Sequence[tuple[int, int]], copies: int, batch_size: int) -> list[list[int]]:
    """Distinct prefixes in chunks of whole sources (a source is encoded once, in one chunk), each
    chunk at most `batch_size` rows (`copies` rows a prefix) unless one source alone needs more."""
    by_source: dict[int, list[int]] = {}
    for u, (source, _) in enumerate(unique):
        by_source.setdefault(source, []).append(u)
    out: list[list[int]] = [[]]
    for members in by_source.values():
        if out[-1] and (len(out[-1]) + len(members)) * copies > batch_size:
            out.append([])
        out[-1].extend(members)
    return [c for c in out if c]


def _cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (keys, values) in enumerate(layers):
        cache.update(keys, values, i)
    return cache


def row_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], pads: Sequence[int], rows: Sequence[tuple[int, int]],
              width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values [C, H, width, D] of each row's cached tokens, right-aligned: row (s, n) holds
    the first n real tokens of encoded source s (at its padding `pads[s]`), zeros on its left."""
    source = torch.tensor([s for s, _ in rows])
    kept = torch.tensor([n for _, n in rows])
    column = torch.arange(width)
    start = width - kept  # where the row's tokens begin
    index = (torch.tensor([pads[s] for s, _ in rows])[:, None] + column[None, :] - start[:, None]).clamp(min=0)
    real = (column[None, :] >= start[:, None])
    out = []
    for keys, values in layers:
        dev = keys.device
        pick = (source.to(dev)[:, None], index.to(dev))
        gathered = []
        for tensor in (keys, values):
            moved = tensor.transpose(1, 2)[pick]  # [C, width, H, D]
            moved = moved * real.to(dev)[:, :, None, None].to(moved.dtype)
            gathered.append(moved.transpose(1, 2).contiguous())
        out.append((gathered[0], gathered[1]))
    return out


@torch.no_grad()
def sample_shared(model, sources: Sequence[Sequence[int]], requests: Sequence[tuple[int, int]], budgets: Sequence[int],
                  copies: int, batch_size: int, generate_kwargs: dict[str, Any], pad_id: int, eos_id: int,
                  device) -> tuple[list[list[int]], dict[str, float]]:
    """`copies` continuations of each request's prefix (`sources[s][:cut]`), at most `budgets[r]`
    tokens each, trimmed after their first EOS: a list request after request, `copies` consecutive
    ones each. Requests with equal prefixes get the same continuations (sampled once). Also returns
    what it did: `distinct` prefixes, `rows` sampled, `generate_calls`, the `tokens` sampled (a shared
    continuation counted once) and `fill`, the share of the rows' decoding steps that sampled one."""
    if len(budgets) != len(requests):
        raise ValueError(f"{len(budgets)} budgets for {len(requests)} requests")
    the_plan = plan(sources, requests)
    budget_of = [0] * len(the_plan.unique)
    for r, u in enumerate(the_plan.of_request):
        budget_of[u] = max(budget_of[u], int(budgets[r]))
    sampled: list[list[list[int]]] = [[] for _ in the_plan.unique]
    calls = steps = 0
    for chunk in chunks(the_plan.unique, copies, batch_size):
        members = sorted({the_plan.unique[u][0] for u in chunk})
        local = {s: i for i, s in enumerate(members)}
        longest = {s: 0 for s in members}
        for u in chunk:
            s, cut = the_plan.unique[u]
            longest[s] = max(longest[s], cut - 1)  # the last prefix token is generate's first input
        encoded = [s for s in members if longest[s] > 0]
        layers, pads = None, [0] * len(members)
        if encoded:
            layers, enc_pads, _ = encode_sources(model, [sources[s][: longest[s]] for s in encoded], pad_id, device)
            for s, pad in zip(encoded, enc_pads.tolist()):
                pads[local[s]] = pad
            index_of = {s: i for i, s in enumerate(encoded)}
        rows = [u for u in chunk for _ in range(copies)]
        width = max(the_plan.unique[u][1] for u in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, u in enumerate(rows):
            s, cut = the_plan.unique[u]
            ids[row, width - cut :] = torch.tensor(list(sources[s][:cut]))
            mask[row, width - cut :] = 1
        kwargs = dict(generate_kwargs)
        if layers is not None and width > 1:
            cached = [(index_of.get(the_plan.unique[u][0], 0), the_plan.unique[u][1] - 1) for u in rows]
            kept_pads = [pads[local[s]] for s in encoded]
            kwargs["past_key_values"] = _cache_of(row_cache(layers, kept_pads, cached, width - 1))
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             max_new_tokens=max(budget_of[u] for u in chunk), **kwargs)
        calls += 1
        steps += len(rows) * (gen.shape[1] - width)
        for row, u in enumerate(rows):
            sampled[u].append(trim_row(gen[row, width:].tolist()[: budget_of[u]], eos_id, pad_id))
    out = []
    for r, u in enumerate(the_plan.of_request):
        out.extend(c[: int(budgets[r])] if len(c) > budgets[r] else c for c in sampled[u])
    tokens = float(sum(len(c) for rows in sampled for c in rows))
    stats = {"distinct": float(len(the_plan.unique)), "rows": float(len(the_plan.unique) * copies),
             "generate_calls": float(calls), "tokens": tokens, "fill": tokens / steps if steps else 1.0}
    return out, stats


@torch.no_grad()
def sample_separate(model, prefixes: Sequence[Sequence[int]], budgets: Sequence[int], copies: int, batch_size: int,
                    generate_kwargs: dict[str, Any], pad_id: int, eos_id: int, device,
                    expected: Sequence[int] | None = None, round_tokens: int = 0, decoding: str = "generate"
                    ) -> tuple[list[list[int]], dict[str, float]]:
    """`copies` continuations of each prefix, at most `budgets[i]` tokens each, trimmed after their
    first EOS (a list prefix after prefix, `copies` consecutive ones each), every row re-encoded by
    `generate`: chunks of `batch_size` rows sorted by how long each likely runs (`expected[i]`, else
    its budget), so that the rows of a call end at about the same time, since a call runs until its
    longest row ends.

    `round_tokens` > 0 samples in rounds of at most that many new tokens: a row that has neither
    ended (EOS) nor used its budget goes on in the next round from its prefix and what it has
    sampled, re-sorted with the others, so a call no longer waits for a long row while the rest have
    ended. A continuation is sampled from the same distribution either way (each token depends on
    the tokens before it only, under temperature and top-p); only the random draws differ. Also
    returns `distinct` (the prefixes), `rows`, `generate_calls`, `rounds`, the `tokens` sampled and
    `fill`, the share of the calls' decoding steps (rows x new positions) that sampled a kept token.

    `decoding` 'loop' samples each chunk with `rl.decoding.decode`, which drops a row from the batch
    the step it ends (EOS or its budget) instead of `generate`, which computes every row until the
    chunk's longest ends: the same distribution, fewer decoding steps. Since a row that ends costs
    nothing more, its chunks group rows by source instead (`_chunks`): one encoding of a response serves
    every boundary of it and every copy."""
    rows = [i for i in range(len(prefixes)) for _ in range(copies)]
    out: list[list[int]] = [[] for _ in rows]
    likely = list(expected) if expected is not None else list(budgets)

    def likely_left(r: int) -> tuple[int, int, int]:  # generate's order: the rows likely to run longest first
        return (-min(likely[rows[r]] - len(out[r]), int(budgets[rows[r]]) - len(out[r])), -int(budgets[rows[r]]),
                -len(prefixes[rows[r]]))

    pending = list(range(len(rows)))
    calls = steps = rounds = 0
    while pending:
        rounds += 1
        pending, todo = [], _chunks(pending, [(*prefixes[rows[r]], *out[r]) for r in range(len(rows))], likely_left,
                                    batch_size, decoding)
        for chunk in todo:
            heads = [list(prefixes[rows[r]]) + out[r] for r in chunk]
            left = [int(budgets[rows[r]]) - len(out[r]) for r in chunk]
            ids, mask = left_padded(heads, pad_id)  # left padding, as the rollouts' prompts have
            new = max(left) if round_tokens <= 0 else min(max(left), round_tokens)
            calls += 1
            if decoding == "loop":
                pieces, computed = decode(model, ids.to(device), mask.to(device), [min(n, new) for n in left],
                                          generate_kwargs, eos_id)
                steps += computed
            else:
                gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                                     **generate_kwargs)
                steps += len(chunk) * (gen.shape[1] - ids.shape[1])
                pieces = [trim_row(row[ids.shape[1] :][: n], eos_id, pad_id) for row, n in zip(gen.tolist(), left)]
            for at, r in enumerate(chunk):
                piece = pieces[at]
                out[r].extend(piece)
                if not (piece and piece[-1] == eos_id) and len(piece) < left[at] and len(piece) == new:
                    pending.append(r)  # cut by the round, not ended: goes on
    tokens = float(sum(len(c) for c in out))
    return out, {"distinct": float(len(prefixes)), "rows": float(len(rows)), "generate_calls": float(calls),
                 "rounds": float(rounds), "tokens": tokens, "fill": tokens / steps if steps else 1.0}


def _chunks(pending: list[int], heads: list[tuple[int, ...]], order: Callable[[int], tuple[int, ...]],
            batch_size: int, decoding: str) -> list[list[int]]:
    """sample_separate's chunks of the rows still to sample, at most `batch_size` rows each. Through
    `generate`, a call runs until its longest row ends: rows sorted by how long each likely runs
    (`order`). Through the loop, rows leave as they end and a source is encoded and read once for all
    its rows (`rl.decoding.nest`: a response's boundaries and their copies): rows grouped by source,
    longest sources first (the least padding), a source's rows together (in pieces of `batch_size` if more)."""
    if decoding != "loop":
        ranked = sorted(pending, key=order)
        return [ranked[at : at + batch_size] for at in range(0, len(ranked), batch_size)]
    distinct = list(dict.fromkeys(heads[r] for r in pending))
    sources, source_of = nest(distinct)
    index = {h: i for i, h in enumerate(distinct)}
    members: dict[int, list[int]] = {}
    for r in pending:
        members.setdefault(source_of[index[heads[r]]], []).append(r)
    out: list[list[int]] = [[]]
    for s in sorted(members, key=lambda s: -len(sources[s])):
        for at in range(0, len(members[s]), batch_size):  # a source with more rows than a chunk: in pieces
            piece = members[s][at : at + batch_size]
            if len(out[-1]) + len(piece) > batch_size:
                out.append([])
            out[-1].extend(piece)
    return [c for c in out if c]


def segment_ends(ends: Sequence[int], boundaries: int) -> list[int]:
    """The step ends a response is continued from and credited at, with at most `boundaries` (> 0;
    0: all) inside it: the inner boundaries evenly spaced over its steps (the j-th of k after step
    j * n / (k + 1) of n, rounded half up), its last step's end always kept. The steps between two
    kept ends form one segment (SPO's segment-level values), valued and credited as one step."""
    ends = list(ends)
    inner = len(ends) - 1
    if boundaries <= 0 or inner <= boundaries:
        return ends
    picks = [int(j * len(ends) / (boundaries + 1) + 0.5) for j in range(1, boundaries + 1)]  # distinct, in [1, inner]
    return [ends[p - 1] for p in picks] + [ends[-1]]


def trim_row(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    """A generated row up to and with its first EOS; without one, trailing padding removed."""
    if eos_id in row:
        return row[: row.index(eos_id) + 1]
    while row and row[-1] == pad_id and pad_id != eos_id:
        row.pop()
    return row
