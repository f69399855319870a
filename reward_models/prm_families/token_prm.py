"""Two-label token-classification PRMs (`*ForTokenClassification`): `token-prm:PATH`.

The question, a newline, then each step followed by a separator token (`<extra_0>`); a step's score
is softmax(logits)[1] at its separator. Served by `reward_models.step_tag_prms.TokenClassificationPRMVerifier`,
which loads the weights strictly: a checkpoint without the classification head (which transformers
would initialise at random) is refused. A Qwen2.5-Math-PRM checkpoint is not this: name it `qwen-prm:`.
"""

from __future__ import annotations

from reward_models.prm_families.base import Checkpoint, PRMFamily

NAME = "token-prm"


def build(path: str, batch_size: int):
    from reward_models.step_tag_prms import TokenClassificationPRMVerifier

    return TokenClassificationPRMVerifier.from_pretrained(path, batch_size=batch_size)


def recognise(ckpt: Checkpoint) -> str | None:
    archs = [a for a in ckpt.architectures if a.endswith("ForTokenClassification")]
    if archs and not (ckpt.path / "psv_config.json").exists():
        return f"config.json architectures: {', '.join(archs)}, read at a separator after each step"
    return None


FAMILY = PRMFamily(name=NAME, summary="token classification: P(label 1) at a separator after each step",
                   recognise=recognise, build=build)
