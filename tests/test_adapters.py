"""Third-party PRM formats on tiny models built offline in those formats."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

from reasoning.tokenizer import train_tokenizer
from reasoning.world import generate
from reward_models.step_tag_prms import MathShepherdVerifier, TokenClassificationPRMVerifier
from reward_models.verifier import Verifier, VerifierInputError


@pytest.fixture(scope="module")
def world():
    rows = generate("train", 20, seed=0)
    tok = train_tokenizer([r["question"] + " ".join(r["steps"]) for r in rows], vocab_size=300)
    tok.add_tokens(["ки", "<extra_0>"])
    return rows, tok


def _config(tok, **kw):
    return LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id, **kw)


def test_math_shepherd_reads_plus_minus_at_each_tag(world, tmp_path):
    rows, tok = world
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(tok)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    verifier = MathShepherdVerifier.from_pretrained(str(tmp_path), batch_size=2)
    assert isinstance(verifier, Verifier)
    questions, paths = [r["question"] for r in rows[:3]], [r["steps"] for r in rows[:3]]
    scores = verifier.score(questions, paths)
    assert [len(s) for s in scores] == [len(p) for p in paths]
    # By hand for the first path: softmax over (+, -) at every tag position.
    text = verifier.render(questions[0], paths[0])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tag, plus, minus = (tok.convert_tokens_to_ids(t) for t in ("ки", "+", "-"))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    expected = [torch.softmax(logits[k, [plus, minus]], -1)[0].item() for k, t in enumerate(ids) if t == tag]
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(scores[0], expected))
    assert "Step 1: " in text and text.count("ки") == len(paths[0])
    with pytest.raises(VerifierInputError, match="marker"):
        verifier.score(["q"], [["a ки b"]])


def test_token_classification_prm_reads_positive_label_at_separators(world, tmp_path):
    rows, tok = world
    torch.manual_seed(0)
    model = LlamaForTokenClassification(_config(tok, num_labels=2)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    verifier = TokenClassificationPRMVerifier.from_pretrained(str(tmp_path), batch_size=3)
    questions, paths = [r["question"] for r in rows[:4]], [r["steps"] for r in rows[:4]]
    scores = verifier.score(questions, paths)
    single = TokenClassificationPRMVerifier(model, tok, batch_size=1).score(questions, paths)
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) for x, y in zip(scores, single) for a, b in zip(x, y))
    text = verifier.render(questions[1], paths[1])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    sep = tok.convert_tokens_to_ids("<extra_0>")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    expected = [torch.softmax(logits[k], -1)[1].item() for k, t in enumerate(ids) if t == sep]
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(scores[1], expected))


def test_marker_must_be_one_token(world):
    rows, tok = world
    model = LlamaForCausalLM(_config(tok)).eval()
    with pytest.raises(ValueError, match="one token"):
        MathShepherdVerifier(model, tok, step_tag="not a single token here")


def test_load_verifier_names_the_adapters(world, tmp_path):
    from reward_models.load import load_verifier

    rows, tok = world
    LlamaForCausalLM(_config(tok)).save_pretrained(tmp_path / "ms")
    tok.save_pretrained(tmp_path / "ms")
    LlamaForTokenClassification(_config(tok, num_labels=2)).save_pretrained(tmp_path / "tc")
    tok.save_pretrained(tmp_path / "tc")
    assert isinstance(load_verifier(f"math-shepherd:{tmp_path / 'ms'}"), MathShepherdVerifier)
    assert isinstance(load_verifier(f"token-prm:{tmp_path / 'tc'}"), TokenClassificationPRMVerifier)
    # the PPO script passes its process's device: a third-party PRM goes there, not left on the CPU
    on_meta = load_verifier(f"math-shepherd:{tmp_path / 'ms'}", device="meta")
    assert next(on_meta.model.parameters()).device.type == "meta"
    on_meta = load_verifier(f"token-prm:{tmp_path / 'tc'}", device="meta")
    assert next(on_meta.model.parameters()).device.type == "meta"
