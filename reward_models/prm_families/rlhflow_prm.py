"""RLHFlow PRMs (Llama3.1-8B-PRM-Deepseek-Data, -Mistral-Data): `rlhflow-prm:PATH`.

A causal LM (`LlamaForCausalLM`) fine-tuned, Math-Shepherd style, to answer `+` or `-` after each
step of a conversation. The model card's scoring code and RLHFlow's `math-rm/prm_evaluate.py`,
followed here: each step is stripped of surrounding whitespace (the script's `j.strip()`; a step
with a leading space would otherwise shift the read positions), the steps become user turns, the
first being the question, one space and step 1 (`problem + " " + step`; the card's code joins
them with a space, not a blank line), each followed by an assistant turn `+`; the conversation is
rendered with the tokenizer's chat template (`apply_chat_template`); a step's score is
softmax over the logits of (`+`, `-`) (ids `tokenizer.encode('+')[-1]`, `tokenizer.encode('-')[-1]`)
at the position that predicts that step's assistant answer, which the card reads as `[-3]` of the
conversation cut after that answer (`+` then `<|eot_id|>` close it). All steps are read from one
forward pass over the whole conversation: for a causal model the logits at a position depend only on
the tokens before it, so this equals the card's one pass per step wherever each cut conversation's
tokens are a prefix of the whole one's, which is checked for every path (and refused otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reward_models.prm_families.base import (
    Checkpoint,
    PRMCheckpointError,
    PRMFamily,
    chat_ids,
    load_strictly,
    load_tokenizer,
)
from reward_models.verifier import VerifierInputError

NAME = "rlhflow-prm"
GOOD, BAD = "+", "-"


def conversation(question: str, steps: Sequence[str]) -> list[dict]:
    """The card's conversation: one user turn per stripped step (the first prefixed by the question
    and a space), each answered `+` by the assistant."""
    turns = []
    for k, step in enumerate(s.strip() for s in steps):
        turns.append({"role": "user", "content": f"{question} {step}" if k == 0 else step})
        turns.append({"role": "assistant", "content": GOOD})
    return turns


def render(tokenizer, question: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
    turns = conversation(question, steps)
    ids = chat_ids(tokenizer, turns)
    positions = []
    for k in range(len(steps)):
        cut = ids if k == len(steps) - 1 else chat_ids(tokenizer, turns[: 2 * k + 2])
        if len(cut) < 3 or ids[: len(cut)] != cut or tokenizer.decode(cut[-2:-1]).strip() != GOOD:
            raise VerifierInputError(
                f"{NAME}: the chat template does not close the assistant's {GOOD!r} with one token, or renders "
                f"step {k}'s conversation differently inside the whole one: the card's [-3] reading does not apply")
        positions.append(len(cut) - 3)
    return ids, positions


def read(model, tokenizer, input_ids, attention_mask, rows, cols):
    good, bad = tokenizer.encode(GOOD)[-1], tokenizer.encode(BAD)[-1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return torch.softmax(logits[rows, cols][:, [good, bad]].float(), dim=-1)[:, 0]


def load(path: str):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(path, NAME, chat_template=True)
    if tok.encode(GOOD)[-1] == tok.encode(BAD)[-1]:
        raise PRMCheckpointError(f"{NAME}:{path}: the tokenizer reads {GOOD!r} and {BAD!r} as the same token")
    try:
        render(tok, "1 + 1 = ?", ["1 + 1 = 2.", "The answer is 2."])
    except VerifierInputError as err:
        raise PRMCheckpointError(f"{NAME}:{path}: {err}") from None
    return load_strictly(AutoModelForCausalLM, path, NAME), tok


def recognise(ckpt: Checkpoint) -> str | None:
    if any(a.endswith("ForCausalLM") for a in ckpt.architectures) and ckpt.chat_template:
        return (f"config.json architectures: {', '.join(ckpt.architectures)}, a causal LM whose tokenizer has a "
                f"chat template: the conversation format, {GOOD!r}/{BAD!r} answers")
    return None


FAMILY = PRMFamily(name=NAME, summary="RLHFlow PRMs: P(+) / (P(+) + P(-)) at each assistant answer of the "
                                      "step-per-turn conversation", recognise=recognise, load=load, render=render,
                   read=read)
