"""Our process-supervised verifier: a causal-LM backbone with a scalar head, read at step ends.

The model is a transformers `*ForTokenClassification` with one label (the backbone plus a linear
head on every position), so it saves and loads with `save_pretrained` / `from_pretrained` in
safetensors and takes LoRA adapters through peft. A step's score is sigmoid(head) at the last
token of the step's closing tag; all steps of a path come from one forward pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from reward_models.verifier import VerifierInputError, layout, token_positions, validate_paths


def load_psv_model(path: str, dtype=None):
    """The PSV model and tokenizer at `path`: a full model, or a LoRA adapter over its base."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    path = str(path)
    adapter = Path(path) / "adapter_config.json"
    tokenizer = AutoTokenizer.from_pretrained(path)
    if adapter.exists():
        from peft import PeftModel

        base_path = json.loads(adapter.read_text())["base_model_name_or_path"]
        base = AutoModelForTokenClassification.from_pretrained(base_path, num_labels=1, dtype=dtype)
        model = PeftModel.from_pretrained(base, path)
    else:
        model = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def init_psv_from_policy(policy_path: str, dtype=None):
    """A fresh PSV whose backbone is the policy's (the head is new), and the policy's tokenizer."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForTokenClassification.from_pretrained(policy_path, num_labels=1, dtype=dtype)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def encode_paths(
    tokenizer, questions: Sequence[str], paths: Sequence[Sequence[str]], max_length: int | None, row_offset: int = 0
):
    """Right-padded batch tensors and, per path, the token index of each step end.

    `row_offset` is the index of the first path in the caller's whole input, for error messages.
    """
    validate_paths(questions, paths)
    texts, positions = [], []
    for i, (question, steps) in enumerate(zip(questions, paths)):
        lay = layout(question, steps)
        enc = tokenizer(lay.text, add_special_tokens=False, return_offsets_mapping=True)
        if max_length is not None and len(enc["input_ids"]) > max_length:
            raise VerifierInputError(
                f"row {row_offset + i}: {len(enc['input_ids'])} tokens, longer than the verifier's context "
                f"({max_length})"
            )
        texts.append(enc["input_ids"])
        positions.append(token_positions(enc["offset_mapping"], lay.step_end_chars))
    width = max(len(t) for t in texts)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(texts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(texts), width), dtype=torch.long)
    for row, ids in enumerate(texts):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}, positions


def step_logits(model, batch: dict, positions: list[list[int]]) -> list[torch.Tensor]:
    """The head's logit at each step end, one tensor per path (differentiable, for training)."""
    logits = model(**batch).logits.squeeze(-1)
    return [logits[row, torch.tensor(pos, device=logits.device)] for row, pos in enumerate(positions)]


class PSVVerifier:
    """The `Verifier` backed by our PSV (full or LoRA)."""

    def __init__(self, model, tokenizer, batch_size: int = 32, max_length: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        config = getattr(model, "config", None)
        self.max_length = max_length or getattr(config, "max_position_embeddings", None)
        self.tokens_used = 0

    @classmethod
    def from_pretrained(cls, path: str, batch_size: int = 32, device: str | None = None, dtype=None):
        model, tokenizer = load_psv_model(path, dtype=dtype)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model, tokenizer, batch_size=batch_size)

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @torch.no_grad()
    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        device = next(self.model.parameters()).device
        out: list[list[float]] = []
        for start in range(0, len(paths), self.batch_size):
            qs, ps = questions[start : start + self.batch_size], paths[start : start + self.batch_size]
            batch, positions = encode_paths(self.tokenizer, qs, ps, self.max_length, row_offset=start)
            self.tokens_used += int(batch["attention_mask"].sum())
            batch = {k: v.to(device) for k, v in batch.items()}
            for logits in step_logits(self.model, batch, positions):
                out.append(torch.sigmoid(logits.float()).tolist())
        return out
