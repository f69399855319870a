"""What every published PRM family shares: its registry entry, the strict loader, the batched scorer.

A family's entry (`PRMFamily`) names its four parts: `load` (weights and tokenizer, refused when
they do not fill the head or lack the separator), `render` (question and steps to token ids, and the
positions where each step's score is read), `read` (the step scores from the model at those
positions) and `recognise` (whether a checkpoint's config.json and tokenizer files are this family's,
for `auto:PATH`). `FamilyVerifier` does the rest for all of them: input checks, one forward pass per
batch of paths (right padding), one score per step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reward_models.verifier import VerifierInputError, validate_paths


class PRMCheckpointError(ValueError):
    """A PRM checkpoint that cannot be scored as its family prescribes, said in one line."""


@dataclass(frozen=True)
class Checkpoint:
    """What `auto:PATH` reads of a checkpoint folder, no weights: its config and tokenizer files."""

    path: Path
    config: dict
    architectures: tuple[str, ...]
    chat_template: bool
    """Whether the tokenizer carries a chat template (tokenizer_config.json or chat_template.jinja)."""
    tokens: frozenset[str]
    """The tokenizer's added and special tokens (tokenizer.json's added_tokens)."""

    @classmethod
    def read(cls, path: str | Path) -> Checkpoint:
        p = Path(path)
        try:
            config = json.loads((p / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PRMCheckpointError(f"auto:{path}: cannot read config.json ({err})") from None
        tok_config = _json_or_empty(p / "tokenizer_config.json")
        chat = bool(tok_config.get("chat_template")) or (p / "chat_template.jinja").exists() \
            or (p / "chat_template.json").exists()
        tokens = {t.get("content") for t in _json_or_empty(p / "tokenizer.json").get("added_tokens", [])}
        tokens |= {t.get("content") for t in (tok_config.get("added_tokens_decoder") or {}).values()}
        return cls(path=p, config=config, architectures=tuple(config.get("architectures") or ()),
                   chat_template=chat, tokens=frozenset(t for t in tokens if isinstance(t, str)))


def _json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class PRMFamily:
    """One registry entry: a published PRM family and how its model card scores steps."""

    name: str
    """The spec prefix (`qwen-prm` for `qwen-prm:PATH`)."""
    summary: str
    """One line: the model(s) and the scoring procedure, for messages and docs."""
    recognise: Callable[[Checkpoint], str | None]
    """The reason a checkpoint is this family's (for `auto:`), or None."""
    load: Callable[[str], tuple] | None = None
    """PATH -> (model, tokenizer), refusing weights that do not fill the head or a tokenizer without
    the separator (`PRMCheckpointError`)."""
    render: Callable[[object, str, Sequence[str]], tuple[list[int], list[int]]] | None = None
    """(tokenizer, question, steps) -> (token ids, the position of each step's score)."""
    read: Callable[..., object] | None = None
    """(model, tokenizer, input_ids, attention_mask, rows, cols) -> a score in [0, 1] per position."""
    build: Callable[[str, int], object] | None = None
    """For a family served by a ready verifier class (the older adapters): (PATH, batch_size) -> Verifier."""
    spec_path: Callable[[str], str] | None = None
    """For a spec that is more than a folder (`PATH@URL`): the folder in it, to check before loading
    (ValueError in one line for a malformed spec). None: the spec is the folder."""

    def verifier(self, path: str, batch_size: int = 16):
        """The `Verifier` reading the checkpoint at `path` as this family does."""
        if self.build is not None:
            return self.build(path, batch_size)
        model, tokenizer = self.load(path)
        return FamilyVerifier(self, model, tokenizer, batch_size=batch_size)


class FamilyVerifier:
    """A `Verifier` over any family's render and read: all steps of a path in one forward pass."""

    def __init__(self, family: PRMFamily, model, tokenizer, batch_size: int = 16):
        self.family = family
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.tokens_used = 0

    def encode(self, question: str, steps: Sequence[str], row: int = 0) -> tuple[list[int], list[int]]:
        """The token ids of one path and the position of each step's score, checked one to one."""
        try:
            ids, positions = self.family.render(self.tokenizer, question, steps)
        except VerifierInputError as err:
            raise VerifierInputError(f"row {row}: {err}") from None
        if len(positions) != len(steps):
            raise VerifierInputError(f"row {row}: {self.family.name} found {len(positions)} score positions "
                                     f"for {len(steps)} steps (a separator merged with neighbouring text?)")
        if self.max_length is not None and len(ids) > self.max_length:
            raise VerifierInputError(f"row {row}: {len(ids)} tokens, longer than the context ({self.max_length})")
        return ids, positions

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        import torch

        validate_paths(questions, paths)
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else (self.tokenizer.eos_token_id or 0)
        out: list[list[float]] = []
        with torch.no_grad():
            for start in range(0, len(paths), self.batch_size):
                encoded = [self.encode(questions[i], paths[i], i)
                           for i in range(start, min(start + self.batch_size, len(paths)))]
                width = max(len(ids) for ids, _ in encoded)
                input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
                mask = torch.zeros_like(input_ids)
                for r, (ids, _) in enumerate(encoded):
                    input_ids[r, : len(ids)] = torch.tensor(ids)
                    mask[r, : len(ids)] = 1
                self.tokens_used += int(mask.sum())
                rows = torch.tensor([r for r, (_, pos) in enumerate(encoded) for _ in pos], device=device)
                cols = torch.tensor([c for _, pos in encoded for c in pos], device=device)
                scores = self.family.read(self.model, self.tokenizer, input_ids.to(device), mask.to(device),
                                          rows, cols).float().tolist()
                k = 0
                for _, pos in encoded:
                    out.append(scores[k: k + len(pos)])
                    k += len(pos)
        return out


# ---- helpers the family modules share ------------------------------------------------------------

def load_strictly(model_class, path: str, spec: str, *, ignore_unexpected: Sequence[str] = (), **kwargs):
    """`model_class.from_pretrained(path)`, refused in one line when the checkpoint's weights do not
    fill the model: a missing key would be initialised at random (a head that means nothing), an
    unexpected one is a weight the model does not read. `ignore_unexpected`: key prefixes a family's
    checkpoints carry and do not use (Skywork's `lm_head.`)."""
    model, info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not k.startswith(tuple(ignore_unexpected)))
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"missing {_some(missing)}")
    if unexpected:
        problems.append(f"unexpected {_some(unexpected)}")
    if mismatched:
        problems.append(f"wrong shape {_some(mismatched)}")
    if problems:
        raise PRMCheckpointError(f"{spec}:{path}: the weights do not fill {type(model).__name__} "
                                 f"({'; '.join(problems)}): refused rather than scored with a randomly "
                                 f"initialised part; is this a {spec} checkpoint? (auto:PATH names the "
                                 f"family from config.json)")
    return model


def _some(keys: Sequence[str], n: int = 6) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def load_tokenizer(path: str, spec: str, *, chat_template: bool = False, tokens: Sequence[str] = ()):
    """The checkpoint's tokenizer, refused in one line when it lacks the chat template or one of
    `tokens` (separators, step tags) as a single token of its own."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if chat_template and not getattr(tok, "chat_template", None):
        raise PRMCheckpointError(f"{spec}:{path}: the tokenizer has no chat template, and {spec} reads its "
                                 f"input through the chat template")
    for token in tokens:
        ids = tok(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1 or ids[0] == tok.unk_token_id:
            raise PRMCheckpointError(f"{spec}:{path}: the tokenizer lacks the separator {token!r} as one token "
                                     f"(it reads as {len(ids)} tokens): not a {spec} tokenizer")
    return tok


def chat_ids(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    """`tokenizer.apply_chat_template(messages)` as a list of ids, whatever the transformers version returns."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return list(out)


def refuse_marker(steps: Sequence[str], marker: str, family: str) -> None:
    """VerifierInputError when a step holds the family's separator (it would be read as a step end)."""
    for j, step in enumerate(steps):
        if marker in step:
            raise VerifierInputError(f"step {j} contains {marker!r}, {family}'s step separator")
