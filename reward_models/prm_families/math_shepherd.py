"""Math-Shepherd PRMs (peiyi9979/math-shepherd-mistral-7b-prm and the like): `math-shepherd:PATH`.

A causal LM reading "question Step 1: ... ки\\nStep 2: ... ки"; a step's score is P(`+`) / (P(`+`) +
P(`-`)) of the next-token distribution at its `ки` tag. Served by
`reward_models.step_tag_prms.MathShepherdVerifier`, which loads the weights strictly (a missing LM head is
refused, not initialised at random).
"""

from __future__ import annotations

from reward_models.prm_families.base import Checkpoint, PRMFamily

NAME = "math-shepherd"


def build(path: str, batch_size: int):
    from reward_models.step_tag_prms import MathShepherdVerifier

    return MathShepherdVerifier.from_pretrained(path, batch_size=batch_size)


def recognise(ckpt: Checkpoint) -> str | None:
    if any(a.endswith("ForCausalLM") for a in ckpt.architectures) and not ckpt.chat_template:
        return (f"config.json architectures: {', '.join(ckpt.architectures)}, a causal LM without a chat "
                "template: plain text with a step tag after each step")
    return None


FAMILY = PRMFamily(name=NAME, summary="Math-Shepherd: P(+) / (P(+) + P(-)) at the ки tag after each step",
                   recognise=recognise, build=build)
