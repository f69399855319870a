"""Adapters for third-party PRM formats, behind the same `Verifier` interface.

- `MathShepherdVerifier`: a causal LM trained Math-Shepherd style. The solution is written with a
  step tag after every step ("Step 1: ... ки\\nStep 2: ... ки"); a step's score is
  P(good) / (P(good) + P(bad)) of the next-token distribution at its tag, with `good` and `bad`
  tokens such as "+" and "-".
- `TokenClassificationPRMVerifier`: a token-classification model with two labels that reads a
  separator token placed after each step; a step's score is P(label 1) at its separator.

Both load their weights strictly (`reward_models.prm_families.base.load_strictly`): a checkpoint
that leaves the LM head or the classification head unfilled is refused, never initialised at random.
The published PRM families with their own input formats (Qwen2.5-Math-PRM, RLHFlow, Skywork) are
in `reward_models.prm_families`, where these two are registered as `math-shepherd` and `token-prm`.

Both score all steps of a path in one forward pass and batch paths (right padding).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from reward_models.prm_families.base import load_strictly
from reward_models.verifier import VerifierInputError, validate_paths


def _single_token_id(tokenizer, text: str, what: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{what} {text!r} must be one token of the tokenizer, got {len(ids)} tokens")
    return ids[0]


class _TaggedVerifier(ABC):
    """Shared plumbing: build the text with a marker after each step, find the markers, batch."""

    marker: str
    marker_id: int

    def __init__(self, model, tokenizer, batch_size: int = 16):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.tokens_used = 0

    @abstractmethod
    def render(self, question: str, steps: Sequence[str]) -> str:
        """The text the model reads: the question and the steps, a marker after each step."""

    @abstractmethod
    def read(self, outputs, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Step scores in [0, 1] read from the model outputs at the markers (rows, cols)."""

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)

    @torch.no_grad()
    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        for i, steps in enumerate(paths):
            if any(self.marker in s for s in steps):
                raise VerifierInputError(f"row {i}: a step contains the marker {self.marker!r}")
        device = next(self.model.parameters()).device
        out: list[list[float]] = []
        for start in range(0, len(paths), self.batch_size):
            encoded = []
            for i in range(start, min(start + self.batch_size, len(paths))):
                ids = self.tokenizer(self.render(questions[i], paths[i]), add_special_tokens=False)["input_ids"]
                positions = [k for k, t in enumerate(ids) if t == self.marker_id]
                if len(positions) != len(paths[i]):
                    raise VerifierInputError(
                        f"row {i}: found {len(positions)} markers for {len(paths[i])} steps "
                        "(the marker merged with neighbouring text?)"
                    )
                if self.max_length is not None and len(ids) > self.max_length:
                    raise VerifierInputError(f"row {i}: {len(ids)} tokens, longer than the context")
                encoded.append((ids, positions))
            width = max(len(ids) for ids, _ in encoded)
            input_ids = torch.full((len(encoded), width), self.tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for r, (ids, _) in enumerate(encoded):
                input_ids[r, : len(ids)] = torch.tensor(ids)
                mask[r, : len(ids)] = 1
            self.tokens_used += int(mask.sum())
            outputs = self.forward(input_ids.to(device), mask.to(device))
            for r, (_, positions) in enumerate(encoded):
                rows = torch.full((len(positions),), r, dtype=torch.long, device=device)
                cols = torch.tensor(positions, dtype=torch.long, device=device)
                out.append(self.read(outputs, rows, cols).float().tolist())
        return out


class MathShepherdVerifier(_TaggedVerifier):
    def __init__(self, model, tokenizer, step_tag: str = "ки", good_token: str = "+", bad_token: str = "-",
                 batch_size: int = 16):
        super().__init__(model, tokenizer, batch_size)
        self.marker = step_tag
        self.marker_id = _single_token_id(tokenizer, step_tag, "step tag")
        self.good_id = _single_token_id(tokenizer, good_token, "good token")
        self.bad_id = _single_token_id(tokenizer, bad_token, "bad token")

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = load_strictly(AutoModelForCausalLM, path, "math-shepherd")
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    def render(self, question: str, steps: Sequence[str]) -> str:
        body = "\n".join(f"Step {k + 1}: {s.strip()} {self.marker}" for k, s in enumerate(steps))
        return f"{question.strip()} {body}"

    def read(self, outputs, rows, cols):
        # The model predicts '+' / '-' in place of the tag: its logits at the tag position.
        logits = outputs.logits[rows, cols][:, [self.good_id, self.bad_id]].float()
        return torch.softmax(logits, dim=-1)[:, 0]


class TokenClassificationPRMVerifier(_TaggedVerifier):
    def __init__(self, model, tokenizer, separator: str = "<extra_0>", positive_label: int = 1,
                 batch_size: int = 16):
        super().__init__(model, tokenizer, batch_size)
        if getattr(model.config, "num_labels", 2) < 2:
            raise ValueError("a token-classification PRM needs at least two labels")
        self.marker = separator
        self.marker_id = _single_token_id(tokenizer, separator, "separator")
        self.positive_label = positive_label

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        # strictly: a checkpoint without the classification head (a causal LM, a Qwen2.5-Math-PRM) is
        # refused, where transformers would initialise the head at random and scores would mean nothing
        model = load_strictly(AutoModelForTokenClassification, path, "token-prm")
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    def render(self, question: str, steps: Sequence[str]) -> str:
        return question.strip() + "\n" + "".join(f"{s.strip()}{self.marker}" for s in steps)

    def read(self, outputs, rows, cols):
        return torch.softmax(outputs.logits[rows, cols].float(), dim=-1)[:, self.positive_label]
