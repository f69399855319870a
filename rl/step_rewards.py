"""Placing step rewards on policy tokens.

A step-level PPO rollout is a generated completion (token ids) in the tagged format of
`reasoning.steps`. A verifier scores its steps, p_1..p_k, and each score becomes a reward on the
policy token where its step ends; the outcome reward (if any) goes on the last token::

    token ids ──decode_with_offsets──► text, char span of each token
    text ──step_end_char_positions──► char index where each step ends
    (spans, chars) ──char_to_token_positions──► token index where each step ends
    Verifier.score ──► p_1..p_k ──shape_step_rewards──► r_1..r_k
    (r, token indices, outcome) ──assign_rewards──► dense per-token rewards [n_tokens]

Where a step ends, in characters of the completion, mirroring `split_steps` exactly (one position
per step it returns, same order):

- a step closed by `</Step>`: the `>` of that tag (so the reward lands on the token holding it,
  the same token at which the verifier reads its score);
- a step cut short by a new `<Step>` (the model forgot `</Step>`), or the unclosed last step of a
  truncated generation, and every chunk of untagged text (blank_lines / lines / whole): its last
  non-whitespace character.

The verifier may use another tokenizer than the policy: positions go through characters, so each
side finds its own token for the same character.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from reasoning.steps import CLOSE_TAG, OPEN_TAG
from reward_models.verifier import token_positions as verifier_token_positions

__all__ = [
    "SHAPING_MODES",
    "RunningMeanStd",
    "assign_rewards",
    "char_to_token_positions",
    "clip_rewards",
    "credited_steps",
    "decode_with_offsets",
    "offsets_from_token_ids",
    "shape_step_rewards",
    "step_end_char_positions",
    "step_end_token_positions",
]

SHAPING_MODES = ("raw", "centered", "delta", "min")

_TAG_RE = re.compile(re.escape(OPEN_TAG) + "|" + re.escape(CLOSE_TAG))
# The same separators as `reasoning.steps.split_steps` uses for untagged text.
_BLANK_LINE_RE = re.compile(r"\n[ \t\r\f\v]*\n")
_REPLACEMENT_CHAR = "\ufffd"  # what a decoder prints for a character whose bytes are not all there yet
_DECODE_WINDOW = 8  # tokens of left context when decoding token by token


# ---------------------------------------------------------------------------------------------
# Where steps end, in characters
# ---------------------------------------------------------------------------------------------


def _last_non_space(text: str, start: int, end: int) -> int | None:
    """Index of the last non-whitespace character of text[start:end] (str.strip's whitespace)."""
    kept = len(text[start:end].rstrip())
    return start + kept - 1 if kept else None


def _tagged_step_ends(text: str) -> list[int]:
    # The walk of `reasoning.steps._split_tagged`, recording where each kept step ends.
    ends: list[int] = []
    open_at: int | None = None  # start of the open step's text
    prev_end = 0  # end of the previous tag
    for m in _TAG_RE.finditer(text):
        if m.group(0) == OPEN_TAG:
            if open_at is not None:  # a step cut short by the next <Step>
                last = _last_non_space(text, open_at, m.start())
                if last is not None:
                    ends.append(last)
            open_at = m.end()
        else:
            start = open_at if open_at is not None else prev_end
            if text[start : m.start()].strip():
                ends.append(m.end() - 1)  # the '>' of </Step>
            open_at = None
        prev_end = m.end()
    if open_at is not None:  # unclosed last step
        last = _last_non_space(text, open_at, len(text))
        if last is not None:
            ends.append(last)
    return ends


def _normalize_newlines(text: str) -> tuple[str, list[int]]:
    """text with \\r\\n and \\r turned into \\n, and for each of its characters the index in `text`."""
    chars: list[str] = []
    origin: list[int] = []
    i = 0
    while i < len(text):
        if text[i] == "\r":
            skip = 2 if text.startswith("\r\n", i) else 1
            chars.append("\n")
            origin.append(i + skip - 1)
            i += skip
        else:
            chars.append(text[i])
            origin.append(i)
            i += 1
    return "".join(chars), origin


def _chunk_spans(stripped: str, separator: re.Pattern[str] | str | None) -> list[tuple[int, int]]:
    """(start, end) of the pieces `stripped` splits into at `separator` (None: one piece)."""
    if separator is None:
        return [(0, len(stripped))]
    if isinstance(separator, str):
        separator = re.compile(re.escape(separator))
    spans, start = [], 0
    for m in separator.finditer(stripped):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(stripped)))
    return spans


def step_end_char_positions(completion_text: str) -> list[int]:
    """Char index where each step of `completion_text` ends, one per step of `split_steps`.

    Tagged text: the `>` of each `</Step>`; a step without its `</Step>` (cut by the next `<Step>`
    or by truncation) ends at its last non-whitespace character. Untagged text: the last
    non-whitespace character of each paragraph / line / the whole text, as `split_steps` chunks it.
    Indices refer to `completion_text` itself (\\r\\n line ends included).
    """
    text = (
        completion_text
        if isinstance(completion_text, str)
        else ("" if completion_text is None else str(completion_text))
    )
    if OPEN_TAG in text or CLOSE_TAG in text:
        return _tagged_step_ends(text)
    normalized, origin = _normalize_newlines(text)
    stripped = normalized.strip()
    if not stripped:
        return []
    lead = len(normalized) - len(normalized.lstrip())
    if _BLANK_LINE_RE.search(stripped):
        spans = _chunk_spans(stripped, _BLANK_LINE_RE)
    elif "\n" in stripped:
        spans = _chunk_spans(stripped, "\n")
    else:
        spans = _chunk_spans(stripped, None)
    ends = []
    for start, end in spans:
        last = _last_non_space(stripped, start, end)
        if last is not None:
            ends.append(origin[lead + last])
    return ends


# ---------------------------------------------------------------------------------------------
# From characters to policy tokens
# ---------------------------------------------------------------------------------------------


def _decoder(tokenizer: Any, skip_special_tokens: bool):
    def decode_many(batch: list[list[int]]) -> list[str]:
        if hasattr(tokenizer, "batch_decode"):
            return list(tokenizer.batch_decode(batch, skip_special_tokens=skip_special_tokens))
        return [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]

    return decode_many


def _prefix_ends(decode_many, ids: list[int], text: str) -> list[int]:
    """Exact, O(n²): after token i, how many characters of `text` decode(ids[:i+1]) has completed.

    A token that ends inside a multi-byte character completes nothing (its decoded prefix ends in
    a replacement character, which is not a prefix of `text`); ends never go down.
    """
    ends, end = [], 0
    for prefix in decode_many([ids[: i + 1] for i in range(len(ids))]):
        if text.startswith(prefix):
            done = len(prefix)
        else:
            done = 0
            for a, b in zip(prefix, text):
                if a != b:
                    break
                done += 1
        end = max(end, done)
        ends.append(end)
    return ends


def _window_ends(decode_many, ids: list[int], text: str) -> list[int] | None:
    """O(n · window): what token i adds is decode(ids[lo:i+1]) minus decode(ids[lo:i]).

    Both decodes share their first token, so a decoder's start-of-text quirks (a stripped
    leading space) cancel out. Returns None, and the caller falls back to `_prefix_ends`,
    unless the pieces tile `text` exactly.
    """
    n = len(ids)
    windows = [ids[max(0, i - _DECODE_WINDOW) : i + 1] for i in range(n)]
    decoded = decode_many(windows + [w[:-1] for w in windows])
    ends, end = [], 0
    for i in range(n):
        after = decoded[i].rstrip(_REPLACEMENT_CHAR)  # an unfinished character: not text yet
        before = decoded[n + i].rstrip(_REPLACEMENT_CHAR)
        if not after.startswith(before):
            return None
        piece = after[len(before) :]
        if not text.startswith(piece, end):
            return None
        end += len(piece)
        if after != decoded[i] and text.startswith(_REPLACEMENT_CHAR, end):
            return None  # a literal U+FFFD in the text: cannot tell it from an unfinished character
        ends.append(end)
    return ends if end == len(text) else None


def decode_with_offsets(
    tokenizer: Any, token_ids: Sequence[int], skip_special_tokens: bool = True
) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of generated `token_ids` and the (start, end) char span of each token in it.

    The text is `tokenizer.decode(token_ids, skip_special_tokens=...)`; score exactly this text so
    that the spans apply. Spans are contiguous and non-decreasing and tile the text: a token that
    stops inside a multi-byte character (byte-level BPE) gets an empty span and the token that
    completes the character gets all of it; special tokens skipped in decoding get empty spans.
    Works with any tokenizer that decodes (fast or slow): O(n) decodes of a few tokens each, with
    an exact O(n²) decoding of every prefix as the fallback for a decoder that is not incremental.
    """
    ids = [int(t) for t in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
    decode_many = _decoder(tokenizer, skip_special_tokens)
    if not ids:
        return decode_many([[]])[0], []
    text = decode_many([ids])[0]
    ends = _window_ends(decode_many, ids, text)
    if ends is None:
        ends = _prefix_ends(decode_many, ids, text)
    starts = [0] + ends[:-1]
    return text, list(zip(starts, ends))


def offsets_from_token_ids(tokenizer: Any, token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Char span of each generated token in `tokenizer.decode(token_ids, skip_special_tokens=True)`.

    See `decode_with_offsets`, which also returns that text.
    """
    return decode_with_offsets(tokenizer, token_ids)[1]


def char_to_token_positions(offsets: Sequence[tuple[int, int]], char_positions: Sequence[int]) -> list[int]:
    """Index of the policy token covering each char position (`reward_models.verifier.token_positions`).

    `offsets` come from `offsets_from_token_ids` or from a fast tokenizer's
    `return_offsets_mapping=True`. When several tokens cover one character (the byte tokens of a
    multi-byte character all carry its span in an offsets mapping) the last of them is used: the
    token that completes the character, as `offsets_from_token_ids` would give.
    """
    text_end = max((end for _, end in offsets), default=0)
    for char in char_positions:
        if not 0 <= char < text_end:
            raise ValueError(
                f"character {char} is outside the {text_end} characters the token offsets cover: "
                "the offsets are not those of this text"
            )
    positions = verifier_token_positions(offsets, char_positions)
    for k, (t, char) in enumerate(zip(positions, char_positions)):
        while t + 1 < len(offsets) and offsets[t + 1][0] <= char < offsets[t + 1][1]:
            t += 1
        positions[k] = t
    return positions


def step_end_token_positions(
    tokenizer: Any, token_ids: Sequence[int], skip_special_tokens: bool = True
) -> tuple[str, list[int]]:
    """(decoded completion, index of the token where each of its steps ends) for generated ids."""
    text, offsets = decode_with_offsets(tokenizer, token_ids, skip_special_tokens)
    return text, char_to_token_positions(offsets, step_end_char_positions(text))


# ---------------------------------------------------------------------------------------------
# From step scores to dense rewards
# ---------------------------------------------------------------------------------------------


def shape_step_rewards(scores: Sequence[float], mode: str) -> list[float]:
    """Turn step scores p_1..p_k (probabilities) into step rewards r_1..r_k.

    - "raw":      r_k = p_k.
    - "centered": r_k = p_k − 0.5 (a step the verifier is unsure of earns nothing).
    - "delta":    r_k = p_k − p_{k−1} with p_0 = 0.5 (the prior of an unscored start), so a step
                  is paid for how much it moved the verifier's belief; the sum telescopes to
                  p_k − 0.5, so longer paths earn no more than short ones.
    - "min":      min-form credit (Cheng et al. 2025, "Stop Summation: Min-Form Credit
                  Assignment Is All Process Reward Model Needs for Reasoning"), in its hard form:
                  r_j = p_j for the one step j with the smallest score (ties: the earliest such
                  step), r = 0 for every other step. The path's total step reward is then
                  min_k p_k, all of it on its weakest step, and with γ = 1 every token up to that
                  step sees the return min_k p_k and every later token 0 (plus any outcome).
    Zero scores give zero rewards.
    """
    if mode not in SHAPING_MODES:
        raise ValueError(f"mode must be one of {', '.join(SHAPING_MODES)}; got {mode!r}")
    p = [float(s) for s in scores]
    if mode == "raw":
        return p
    if mode == "centered":
        return [s - 0.5 for s in p]
    if mode == "delta":
        previous = [0.5] + p[:-1]
        return [s - prev for s, prev in zip(p, previous)]
    # mode == "min"
    rewards = [0.0] * len(p)
    if p:
        weakest = min(range(len(p)), key=lambda k: (p[k], k))
        rewards[weakest] = p[weakest]
    return rewards


def credited_steps(scores: Sequence[float], mode: str) -> list[int]:
    """Indices of the steps that carry a reward under `mode`: every step, except under "min", where
    only the weakest one does (the earliest of equal weakest, as `shape_step_rewards` picks it).
    A critic-free group estimator normalises only these rewards: under "min" a path has one."""
    if mode not in SHAPING_MODES:
        raise ValueError(f"mode must be one of {', '.join(SHAPING_MODES)}; got {mode!r}")
    if mode != "min":
        return list(range(len(scores)))
    return [min(range(len(scores)), key=lambda k: (float(scores[k]), k))] if len(scores) else []


def assign_rewards(
    step_rewards: Sequence[float],
    token_positions: Sequence[int],
    n_tokens: int,
    outcome: float | None = None,
    last_token: int | None = None,
) -> list[float]:
    """Dense per-token rewards [n_tokens]: each step reward added at its token position.

    Two steps ending in the same token add up there. `outcome`, if given, is added at
    `last_token` (default n_tokens − 1, the last generated token). Positions outside
    [0, n_tokens) raise ValueError.
    """
    if len(step_rewards) != len(token_positions):
        raise ValueError(f"{len(step_rewards)} step rewards but {len(token_positions)} token positions")
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    rewards = [0.0] * n_tokens
    for k, (reward, position) in enumerate(zip(step_rewards, token_positions)):
        if not 0 <= position < n_tokens:
            raise ValueError(f"step {k} ends at token {position}, outside the {n_tokens} response tokens")
        rewards[position] += float(reward)
    if outcome is not None:
        where = n_tokens - 1 if last_token is None else last_token
        if not 0 <= where < n_tokens:
            raise ValueError(
                f"the outcome reward goes at token {where}, outside the {n_tokens} response tokens"
            )
        rewards[where] += float(outcome)
    return rewards


# ---------------------------------------------------------------------------------------------
# Clipping and normalisation
# ---------------------------------------------------------------------------------------------


def _map_values(x: Any, fn) -> Any:
    """fn applied to a number, each item of a list / tuple, or elementwise to a tensor or array."""
    if isinstance(x, (int, float)):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_values(v, fn) for v in x)
    return fn(x)  # torch tensors and numpy arrays support the arithmetic used below


def clip_rewards(x: Any, clip: float | None) -> Any:
    """x clipped to [−clip, clip] (a number, list, tensor or array; same kind back); None: unchanged."""
    if clip is None:
        return x
    if clip <= 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")

    def fn(v):
        if isinstance(v, (int, float)):
            return min(max(float(v), -clip), clip)
        return v.clip(-clip, clip)

    return _map_values(x, fn)


def _flat_floats(values: Any) -> list[float]:
    if hasattr(values, "detach"):
        values = values.detach().double().cpu().flatten().tolist()
    elif hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if isinstance(values, (int, float)):
        return [float(values)]
    out: list[float] = []
    for v in values:
        out.extend(_flat_floats(v) if isinstance(v, (list, tuple)) else [float(v)])
    return out


class RunningMeanStd:
    """Running mean and variance of every value seen (Welford / Chan et al. batch merge).

    For reward normalisation: `normalize(x)` divides by the running std (and subtracts the
    running mean with `center=True`). Checkpoint it with `state_dict` / `load_state_dict`.
    """

    def __init__(self, epsilon: float = 1e-8):
        self.epsilon = epsilon
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    def update(self, values: Iterable[float] | Any) -> None:
        batch = _flat_floats(values)
        if not batch:
            return
        if not all(math.isfinite(v) for v in batch):
            raise ValueError("RunningMeanStd.update got a NaN or infinite value")
        n = len(batch)
        batch_mean = math.fsum(batch) / n
        batch_m2 = math.fsum((v - batch_mean) ** 2 for v in batch)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def var(self) -> float:
        """Population variance of the values seen (0 before any)."""
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def normalize(self, x: Any, center: bool = False) -> Any:
        """x / sqrt(var + epsilon) (minus the mean first if `center`); x unchanged before 2 values."""
        if self.count < 2:
            return x
        scale = math.sqrt(self.var + self.epsilon)
        shift = self.mean if center else 0.0
        return _map_values(x, lambda v: (v - shift) / scale)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2, "epsilon": self.epsilon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count = int(state["count"])
        self.mean = float(state["mean"])
        self.m2 = float(state["m2"])
        self.epsilon = float(state.get("epsilon", self.epsilon))
