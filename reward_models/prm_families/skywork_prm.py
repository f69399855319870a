"""Skywork-o1-Open-PRM (Qwen-2.5-1.5B, -7B): `skywork-prm:PATH`.

As published (SkyworkAI/skywork-o1-prm-inference, `prm_model.py` and `io_utils.py`): a Qwen2 causal
LM wrapped with a value head, saved as config.json architecture `Qwen2ForPrmModel`, the backbone's
weights (`model.*`, and `lm_head.*`, which scoring does not read) and `v_head.summary.weight` /
`v_head.summary.bias` (a Linear(hidden, 1) over the last hidden state, after dropout, which is off at
inference). The wrapper builds the value head in float32 beside a bf16 backbone and upcasts the last
hidden state before it; here `_keep_in_fp32_modules_strict` loads a bf16 checkpoint's head the same way.
The scoring code followed here (`prepare_input`): the ids of
`tokenizer.encode(bos_token + problem + "\\n")`, then for each step `tokenizer.encode(step)` (each step
encoded on its own) followed by the id of the step token "\\n" (`tokenizer.encode("\\n")[-1]`); a
step's score is sigmoid(value) at that "\\n", the step's last token (`derive_step_rewards` with
`return_probs=True`). A policy's step that holds "\\n" is rendered as the card renders its lines
(each line encoded, each followed by the step token) and read at its last "\\n": the card's score of
the path up to the end of that step, so that the scores stay one per policy step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import Qwen2Model, Qwen2PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput

from reward_models.prm_families.base import (
    Checkpoint,
    PRMCheckpointError,
    PRMFamily,
    load_strictly,
    load_tokenizer,
)

NAME = "skywork-prm"
STEP_TOKEN = "\n"
ARCHITECTURE = "Qwen2ForPrmModel"


class ValueHead(nn.Module):
    """Skywork's value head: dropout (off at inference), then `summary` = Linear(hidden, 1)."""

    def __init__(self, config):
        super().__init__()
        self.dropout = nn.Dropout(getattr(config, "summary_dropout_prob", 0.1) or 0.0)
        self.summary = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden):
        hidden = self.dropout(hidden)
        return self.summary(hidden.to(self.summary.weight.dtype))


class Qwen2ForPrmModel(Qwen2PreTrainedModel):
    """The published PRM's weights: a Qwen2 backbone (`model.*`) and `v_head.summary`; its logits are
    the value head's output per token (apply sigmoid for the step probability)."""

    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]
    _keep_in_fp32_modules_strict = ["v_head"]

    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.v_head = ValueHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return TokenClassifierOutput(logits=self.v_head(hidden).squeeze(-1))


def load(path: str):
    tok = load_tokenizer(path, NAME)
    if tok.bos_token is None:
        raise PRMCheckpointError(f"{NAME}:{path}: the tokenizer has no bos_token, which the card's input "
                                 f"starts with")
    return load_strictly(Qwen2ForPrmModel, path, NAME, ignore_unexpected=("lm_head.",)), tok


def render(tokenizer, question: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
    ids = tokenizer.encode(tokenizer.bos_token + question + STEP_TOKEN)
    step_token_id = tokenizer.encode(STEP_TOKEN)[-1]
    positions = []
    for step in steps:
        for line in step.split(STEP_TOKEN):  # the card's lines; a policy step may hold several
            ids = ids + (tokenizer.encode(line) if line else []) + [step_token_id]
        positions.append(len(ids) - 1)
    return ids, positions


def read(model, tokenizer, input_ids, attention_mask, rows, cols):
    values = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return torch.sigmoid(values[rows, cols].float())


def recognise(ckpt: Checkpoint) -> str | None:
    if ARCHITECTURE in ckpt.architectures:
        return f"config.json architectures: {ARCHITECTURE}"
    return None


FAMILY = PRMFamily(name=NAME, summary="Skywork-o1-Open-PRM: sigmoid of the value head at the \\n ending each step",
                   recognise=recognise, load=load, render=render, read=read)
