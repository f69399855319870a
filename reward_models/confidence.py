"""The training-free confidence verifiers: the policy's own probability of what each step says.

For every step, the lowest probability the policy gives to one of the step's tokens, on one of two
spans:

- `result` (spec `confidence`): the step's *result*: the number after the last "=", else the
  step's answer inside <ans>...</ans>, else every token of the step. It catches arithmetic slips.
- `step` (spec `step-confidence`): every token of the step, its `<Step>` and `</Step>` tags
  included: the name it computes, the operands, the operation, the result and where it ends. It
  also catches the decisions a path gets wrong (a wrong name or operand drawn from a low-probability
  choice), which on the arithmetic world are most errors.

`reduce="mean"` (spec `step-likelihood`) scores a span by the geometric mean of its token
probabilities instead of their minimum: the step's per-token likelihood.

One forward pass of the policy per path, batched. No training, no labels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch

from reasoning.steps import join_steps
from reward_models.verifier import VerifierInputError, layout, validate_paths

_RESULT_RE = re.compile(r"=\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)(?![\s\S]*=)")
_ANS_RE = re.compile(r"<ans>([\s\S]*?)</ans>")


def result_span(step: str) -> tuple[int, int]:
    """Character span of the step's result inside the step text."""
    m = _RESULT_RE.search(step)
    if m:
        return m.span(1)
    m = _ANS_RE.search(step)
    if m and m.group(1).strip():
        return m.span(1)
    return (0, len(step))


SPANS = ("result", "step")
REDUCTIONS = ("min", "mean")


class ConfidenceVerifier:
    def __init__(self, model, tokenizer, batch_size: int = 32, span: str = "result", reduce: str = "min"):
        if span not in SPANS:
            raise ValueError(f"span must be one of {', '.join(SPANS)}, got {span!r}")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
        self.span = span
        self.reduce = reduce
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.tokens_used = 0

    @classmethod
    def from_pretrained(cls, policy_path: str, batch_size: int = 32, device: str | None = None,
                        span: str = "result", reduce: str = "min"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(policy_path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(policy_path)
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        return cls(model, tokenizer, batch_size, span=span, reduce=reduce)

    def _spans(self, question: str, steps: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
        lay = layout(question, steps)
        spans = []
        for step, end in zip(steps, lay.step_end_chars):
            body = step.strip()
            if self.span == "step":
                # "<Step> {body}</Step>", ending at `end` (the closing tag's last character).
                spans.append((end + 1 - len(join_steps([body])), end + 1))
                continue
            # The step's text sits just before its closing tag: "<Step> {body}</Step>".
            body_start = end - len("</Step>") + 1 - len(body)
            s, e = result_span(body)
            spans.append((body_start + s, body_start + e))
        return lay.text, spans

    @torch.no_grad()
    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        device = next(self.model.parameters()).device
        tok = self.tokenizer
        out: list[list[float]] = []
        for start in range(0, len(paths), self.batch_size):
            encs, spans_per_path = [], []
            for i in range(start, min(start + self.batch_size, len(paths))):
                text, spans = self._spans(questions[i], paths[i])
                enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
                if self.max_length is not None and len(enc["input_ids"]) > self.max_length:
                    raise VerifierInputError(f"row {i}: longer than the policy's context ({self.max_length})")
                encs.append(enc)
                spans_per_path.append(spans)
            width = max(len(e["input_ids"]) for e in encs)
            ids = torch.full((len(encs), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, e in enumerate(encs):
                ids[r, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
                mask[r, : len(e["input_ids"])] = 1
            self.tokens_used += int(mask.sum())
            logprobs = torch.log_softmax(self.model(input_ids=ids.to(device),
                                                    attention_mask=mask.to(device)).logits.float(), -1)
            for r, (e, spans) in enumerate(zip(encs, spans_per_path)):
                offsets = e["offset_mapping"]
                scores = []
                for s, t in spans:
                    toks = [k for k, (a, b) in enumerate(offsets) if a < t and b > s and k > 0]
                    lps = [logprobs[r, k - 1, e["input_ids"][k]].item() for k in toks]
                    if not lps:
                        scores.append(0.0)
                    elif self.reduce == "mean":
                        scores.append(math.exp(sum(lps) / len(lps)))
                    else:
                        scores.append(math.exp(min(lps)))
                out.append(scores)
        return out
