"""Qwen2.5-Math-PRM (7B, 72B): `qwen-prm:PATH`.

As published: architecture `Qwen2ForProcessRewardModel` (remote code, loaded with `AutoModel` and
`trust_remote_code`), a Qwen2 backbone (`model.*`) and a two-layer head `score` = Linear(hidden,
hidden) (`score.0`), ReLU, Linear(hidden, 2) (`score.2`), two logits per token. The model card's
scoring: the PRM tokenizer's chat template over a system turn ("Please reason step by step, and put
your final answer within \\boxed{}."), the question as the user turn and the steps joined by
`<extra_0>`, with one `<extra_0>` after the last step, as the assistant turn; the rendered text
encoded with `tokenizer.encode`; a step's score is softmax(logits)[1] at its `<extra_0>`.

The architecture is written here (the checkpoint's remote code is not downloaded or run) with the
same weight names, and loaded strictly: a checkpoint whose weights leave any of `score.*` (or the
backbone) unfilled, or carry weights it does not read, is refused, as is a tokenizer without
`<extra_0>` or a chat template.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import Qwen2Model, Qwen2PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput

from reward_models.prm_families.base import (
    Checkpoint,
    PRMFamily,
    load_strictly,
    load_tokenizer,
    refuse_marker,
)

NAME = "qwen-prm"
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
SEPARATOR = "<extra_0>"
ARCHITECTURE = "Qwen2ForProcessRewardModel"


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    """The published PRM's architecture: Qwen2 backbone, `score` = Linear, ReLU, Linear(hidden, 2)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = 2
        self.model = Qwen2Model(config)
        self.score = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.ReLU(),
                                   nn.Linear(config.hidden_size, self.num_labels))
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))


def load(path: str):
    tok = load_tokenizer(path, NAME, chat_template=True, tokens=(SEPARATOR,))
    return load_strictly(Qwen2ForProcessRewardModel, path, NAME), tok


def render(tokenizer, question: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
    refuse_marker(steps, SEPARATOR, NAME)
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question},
                {"role": "assistant", "content": SEPARATOR.join(steps) + SEPARATOR}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = tokenizer.encode(text)
    sep = tokenizer.encode(SEPARATOR)[0]
    return ids, [k for k, t in enumerate(ids) if t == sep]


def read(model, tokenizer, input_ids, attention_mask, rows, cols):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return torch.softmax(logits[rows, cols].float(), dim=-1)[:, 1]


def recognise(ckpt: Checkpoint) -> str | None:
    if ARCHITECTURE in ckpt.architectures:
        return f"config.json architectures: {ARCHITECTURE}"
    return None


FAMILY = PRMFamily(name=NAME, summary="Qwen2.5-Math-PRM: P(positive) at each <extra_0> of its chat template",
                   recognise=recognise, load=load, render=render, read=read)
