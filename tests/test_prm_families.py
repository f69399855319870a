"""Published PRM families, each on a tiny stand-in built offline here in the published format (the
architecture name in config.json, the weight names, the special tokens, a chat template of the same
shape), scored through its spec and against a plain re-implementation, written here, of the scoring
code on the family's model card: the same scores to 1e-5, one per step. Then the refusals: weights that
do not fill the head, a tokenizer without the separator, and what `auto:PATH` reads."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken
from torch import nn
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForTokenClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Model,
)

from reasoning.tokenizer import train_tokenizer
from reasoning.world import generate
from reward_models.load import check_spec, load_verifier
from reward_models.prm_families.base import FamilyVerifier, PRMCheckpointError
from reward_models.verifier import Verifier, VerifierInputError

QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
          "{%- endif %}")
LLAMA3 = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def rows():
    return generate("train", 12, seed=1)


def _paths(rows, n=5):
    """Questions and paths of different lengths (so batches pad)."""
    qs = [r["question"] for r in rows[:n]]
    ps = [r["steps"][: 1 + k % len(r["steps"])] if k % 2 else r["steps"] for k, r in enumerate(rows[:n])]
    return qs, ps


def _tokenizer(rows, special=(), bos=None, template=None):
    tok = train_tokenizer([r["question"] + " " + " ".join(r["steps"]) for r in rows], vocab_size=300)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if bos:
        tok.bos_token = bos
    if template:
        tok.chat_template = template
    tok.padding_side = "right"
    return tok


def _qwen_config(tok, arch):
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.3,
                      pad_token_id=tok.pad_token_id)
    cfg.architectures = [arch]
    return cfg


def _save(folder, cfg, tok, tensors, extra_config=None):
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(folder)
    if extra_config:
        config = json.loads((folder / "config.json").read_text())
        config.update(extra_config)
        (folder / "config.json").write_text(json.dumps(config))
    tok.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def _backbone_tensors(cfg, seed):
    torch.manual_seed(seed)
    return {f"model.{k}": v for k, v in Qwen2Model(cfg).state_dict().items()}


def _linear(n_in, n_out, seed, scale=1.0):
    torch.manual_seed(seed)
    return torch.randn(n_out, n_in) * scale / math.sqrt(n_in), torch.randn(n_out) * 0.1


def _close(got, expected):
    assert [len(s) for s in got] == [len(s) for s in expected]
    for a, b in zip(got, expected):
        assert all(abs(x - y) < 1e-5 for x, y in zip(a, b)), (a, b)


# ---- Qwen2.5-Math-PRM -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen(rows, tmp_path_factory):
    tok = _tokenizer(rows, special=("<|im_start|>", "<|im_end|>", "<extra_0>"), template=CHATML)
    cfg = _qwen_config(tok, "Qwen2ForProcessRewardModel")
    h = cfg.hidden_size
    tensors = _backbone_tensors(cfg, 0)
    w0, b0 = _linear(h, h, 1, scale=3.0)
    w2, b2 = _linear(h, 2, 2, scale=3.0)
    tensors.update({"score.0.weight": w0, "score.0.bias": b0, "score.2.weight": w2, "score.2.bias": b2})
    auto_map = {"AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel"}
    folder = _save(tmp_path_factory.mktemp("qwen") / "prm", cfg, tok, tensors, {"auto_map": auto_map})
    return folder, AutoTokenizer.from_pretrained(folder), cfg, tensors  # the tokenizer as the card loads it


class QwenCardModel(nn.Module):
    """The card's model, plainly: the backbone, then Linear, ReLU, Linear over every token."""

    def __init__(self, folder, cfg):
        super().__init__()
        state = load_file(str(folder / "model.safetensors"))
        self.backbone = Qwen2Model(cfg)
        self.backbone.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
        h = cfg.hidden_size
        self.l0, self.l2 = nn.Linear(h, h), nn.Linear(h, 2)
        self.l0.load_state_dict({"weight": state["score.0.weight"], "bias": state["score.0.bias"]})
        self.l2.load_state_dict({"weight": state["score.2.weight"], "bias": state["score.2.bias"]})

    def forward(self, input_ids):
        return (self.l2(torch.relu(self.l0(self.backbone(input_ids=input_ids).last_hidden_state))),)


def qwen_card_scores(model, tokenizer, question, steps):
    """Qwen2.5-Math-PRM's model card, step for step."""
    messages = [{"role": "system", "content": QWEN_SYSTEM}, {"role": "user", "content": question},
                {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"}]
    conversation_str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    input_ids = tokenizer.encode(conversation_str, return_tensors="pt")
    with torch.no_grad():
        outputs = model(input_ids=input_ids)
    step_sep_id = tokenizer.encode("<extra_0>")[0]
    token_masks = input_ids == step_sep_id
    probabilities = F.softmax(outputs[0], dim=-1) * token_masks.unsqueeze(-1)
    sample = probabilities[0]
    return sample[sample != 0].view(-1, 2)[:, 1].tolist()


def test_qwen_prm_scores_as_its_model_card(qwen, rows):
    folder, tok, cfg, _ = qwen
    verifier = load_verifier(f"qwen-prm:{folder}", batch_size=3)
    assert isinstance(verifier, Verifier) and isinstance(verifier, FamilyVerifier)
    assert type(verifier.model).__name__ == "Qwen2ForProcessRewardModel"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForProcessRewardModel"]
    questions, paths = _paths(rows)
    got = verifier.score(questions, paths)
    card = QwenCardModel(folder, cfg).eval()
    expected = [qwen_card_scores(card, tok, q, p) for q, p in zip(questions, paths)]
    _close(got, expected)
    assert max(max(s) - min(s) for s in got) > 1e-3  # the head reads something: scores are not all equal
    assert verifier.tokens_used > 0
    with pytest.raises(VerifierInputError, match="row 1: step 0 contains '<extra_0>'"):
        verifier.score(["q", "q"], [["a"], ["a <extra_0> b"]])


def test_qwen_prm_refuses_weights_that_do_not_fill_its_head(qwen, tmp_path):
    folder, tok, cfg, tensors = qwen
    no_head = {k: v for k, v in tensors.items() if not k.startswith("score.")}
    _save(tmp_path / "nohead", cfg, tok, no_head)
    with pytest.raises(PRMCheckpointError, match=r"missing score\.0\.bias, score\.0\.weight") as err:
        load_verifier(f"qwen-prm:{tmp_path / 'nohead'}")
    assert "\n" not in str(err.value)
    # a one-layer `score` head (token classification's) is not this head
    flat = dict(no_head, **{"score.weight": tensors["score.2.weight"], "score.bias": tensors["score.2.bias"]})
    _save(tmp_path / "flat", cfg, tok, flat)
    with pytest.raises(PRMCheckpointError, match=r"unexpected score\.bias, score\.weight"):
        load_verifier(f"qwen-prm:{tmp_path / 'flat'}")
    # token-prm would load a Qwen PRM into a token-classification head: refused, not initialised at random
    with pytest.raises(PRMCheckpointError, match=r"missing score\.bias, score\.weight; unexpected score\.0"):
        load_verifier(f"token-prm:{folder}")


def test_qwen_prm_refuses_a_tokenizer_without_the_separator(qwen, rows, tmp_path):
    _, _, cfg, tensors = qwen
    tok = _tokenizer(rows, special=("<|im_start|>", "<|im_end|>", "<extra_1>"), template=CHATML)
    _save(tmp_path / "nosep", cfg, tok, tensors)
    with pytest.raises(PRMCheckpointError, match="lacks the separator '<extra_0>'") as err:
        load_verifier(f"qwen-prm:{tmp_path / 'nosep'}")
    assert "\n" not in str(err.value)


# ---- RLHFlow (Llama-3.1, conversation, +/-) ------------------------------------------------------

@pytest.fixture(scope="module")
def rlhflow(rows, tmp_path_factory):
    tok = _tokenizer(rows, special=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                     bos="<|begin_of_text|>", template=LLAMA3)
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.3)
    model = LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("rlhflow") / "prm"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, AutoTokenizer.from_pretrained(folder)


def rlhflow_card_scores(model, tokenizer, question, steps):
    """RLHFlow's model card (one pass per step over the conversation so far, logits at [-3])."""
    plus_tag_id = tokenizer.encode("+")[-1]
    minus_tag_id = tokenizer.encode("-")[-1]
    candidate_tokens = [plus_tag_id, minus_tag_id]
    single_step_score = []
    conversation = []
    for k in range(len(steps)):
        text = question + " " + steps[0] if k == 0 else steps[k]
        conversation.append({"content": text, "role": "user"})
        conversation.append({"content": "+", "role": "assistant"})
        input_ids = tokenizer.apply_chat_template(conversation, return_tensors="pt")
        if not torch.is_tensor(input_ids):  # transformers 5 returns a BatchEncoding
            input_ids = input_ids["input_ids"]
        with torch.no_grad():
            logits = model(input_ids).logits[:, -3, candidate_tokens]
            scores = logits.softmax(dim=-1)[:, 0]
        single_step_score.append(scores[0].item())
    return single_step_score


def test_rlhflow_prm_scores_as_its_model_card(rlhflow, rows):
    folder, tok = rlhflow
    verifier = load_verifier(f"rlhflow-prm:{folder}", batch_size=2)
    questions, paths = _paths(rows)
    got = verifier.score(questions, paths)
    card = LlamaForCausalLM.from_pretrained(folder).eval()
    expected = [rlhflow_card_scores(card, tok, q, p) for q, p in zip(questions, paths)]
    _close(got, expected)
    assert max(max(s) - min(s) for s in got) > 1e-4


def test_rlhflow_prm_strips_each_step_as_its_evaluation_script(rlhflow, rows):
    """RLHFlow's `math-rm/prm_evaluate.py` strips every step before it builds the conversation, so a
    policy's step with leading or trailing spaces scores as the stripped step."""
    folder, tok = rlhflow
    verifier = load_verifier(f"rlhflow-prm:{folder}", batch_size=2)
    questions, paths = _paths(rows, 3)
    padded = [[("  " if k % 2 else " ") + s + (" " if k % 3 == 0 else "") for k, s in enumerate(p)] for p in paths]
    card = LlamaForCausalLM.from_pretrained(folder).eval()
    expected = [rlhflow_card_scores(card, tok, q, [s.strip() for s in p]) for q, p in zip(questions, padded)]
    _close(verifier.score(questions, padded), expected)


def test_rlhflow_prm_refuses_a_tokenizer_without_a_chat_template_or_a_head(rlhflow, tmp_path):
    folder, tok = rlhflow
    plain = LlamaForCausalLM.from_pretrained(folder)
    plain.save_pretrained(tmp_path / "plain")
    tok_plain = type(tok).from_pretrained(folder)
    tok_plain.chat_template = None
    tok_plain.save_pretrained(tmp_path / "plain")
    (tmp_path / "plain" / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(PRMCheckpointError, match="no chat template"):
        load_verifier(f"rlhflow-prm:{tmp_path / 'plain'}")
    state = load_file(str(folder / "model.safetensors"))
    del state["lm_head.weight"]
    (tmp_path / "nolm").mkdir()
    save_file(state, str(tmp_path / "nolm" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "nolm" / "config.json").write_text((folder / "config.json").read_text())
    tok.save_pretrained(tmp_path / "nolm")
    with pytest.raises(PRMCheckpointError, match=r"missing lm_head\.weight"):
        load_verifier(f"rlhflow-prm:{tmp_path / 'nolm'}")


# ---- Skywork-o1-Open-PRM (value head) -----------------------------------------------------------

@pytest.fixture(scope="module")
def skywork(rows, tmp_path_factory):
    tok = _tokenizer(rows, special=("<|endoftext|>",), bos="<|endoftext|>")
    cfg = _qwen_config(tok, "Qwen2ForPrmModel")
    tensors = _backbone_tensors(cfg, 4)
    tensors["lm_head.weight"] = torch.randn(len(tok), cfg.hidden_size) * 0.02
    w, b = _linear(cfg.hidden_size, 1, 5, scale=3.0)
    tensors.update({"v_head.summary.weight": w, "v_head.summary.bias": b})
    # as the published config.json: tied embeddings, remote-code auto_map (neither read here)
    auto_map = {"AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForRewardModel"}
    folder = _save(tmp_path_factory.mktemp("skywork") / "prm", cfg, tok, tensors,
                   {"auto_map": auto_map, "tie_word_embeddings": True})
    return folder, AutoTokenizer.from_pretrained(folder), cfg, tensors


def skywork_card_scores(folder, tokenizer, question, steps):
    """Skywork's reference code (prepare_input, the value head over hidden_states[-1], sigmoid)."""
    problem, response, step_token = question, "\n".join(steps), "\n"
    prompt_ids = tokenizer.encode(tokenizer.bos_token + problem + "\n")
    response_ids, reward_flags = [], [0] * len(prompt_ids)
    step_token_id = tokenizer.encode(step_token)[-1]
    for step in response.split(step_token):
        if step == "":
            break
        step_ids = tokenizer.encode(step) + [step_token_id]
        flag = [0] * len(step_ids)
        flag[-1] = 1
        response_ids.extend(step_ids)
        reward_flags.extend(flag)
    input_ids = torch.tensor([prompt_ids + response_ids])
    lm = Qwen2ForCausalLM.from_pretrained(folder).eval()  # the wrapped causal LM; v_head.* unused by it
    state = load_file(str(folder / "model.safetensors"))
    summary = nn.Linear(lm.config.hidden_size, 1)
    summary.load_state_dict({"weight": state["v_head.summary.weight"], "bias": state["v_head.summary.bias"]})
    with torch.no_grad():
        last_hidden_state = lm(input_ids=input_ids, output_hidden_states=True).hidden_states[-1]
        value = torch.sigmoid(summary(last_hidden_state).squeeze(-1))
    flags = torch.tensor([reward_flags])
    return [value[0][i].item() for i in torch.nonzero(flags[0] == 1).view(-1)]


def test_skywork_prm_scores_as_its_reference_code(skywork, rows):
    folder, tok, _, _ = skywork
    verifier = load_verifier(f"skywork-prm:{folder}", batch_size=4)
    assert type(verifier.model).__name__ == "Qwen2ForPrmModel"
    questions, paths = _paths(rows)
    got = verifier.score(questions, paths)
    expected = [skywork_card_scores(folder, tok, q, p) for q, p in zip(questions, paths)]
    _close(got, expected)
    assert max(max(s) - min(s) for s in got) > 1e-3


def test_skywork_prm_reads_pytorch_weights_and_refuses_a_checkpoint_without_its_value_head(skywork, rows, tmp_path):
    folder, tok, cfg, tensors = skywork
    # the published Skywork checkpoints ship pytorch_model.bin, not safetensors
    (tmp_path / "bin").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bin" / name).write_bytes((folder / name).read_bytes())
    torch.save(tensors, tmp_path / "bin" / "pytorch_model.bin")
    questions, paths = _paths(rows, 2)
    _close(load_verifier(f"skywork-prm:{tmp_path / 'bin'}").score(questions, paths),
           load_verifier(f"skywork-prm:{folder}").score(questions, paths))
    _save(tmp_path / "nohead", cfg, tok, {k: v for k, v in tensors.items() if not k.startswith("v_head.")})
    with pytest.raises(PRMCheckpointError, match=r"missing v_head\.summary\.bias, v_head\.summary\.weight"):
        load_verifier(f"skywork-prm:{tmp_path / 'nohead'}")


def test_skywork_prm_keeps_its_value_head_in_float32_over_a_bf16_backbone(skywork, rows, tmp_path):
    """Skywork's wrapper builds the value head in float32 beside the bf16 backbone and upcasts the
    last hidden state before it; a bf16 checkpoint loads here the same way."""
    folder, tok, cfg, tensors = skywork
    _save(tmp_path / "bf16", cfg, tok, {k: v.to(torch.bfloat16) for k, v in tensors.items()},
          {"torch_dtype": "bfloat16"})
    verifier = load_verifier(f"skywork-prm:{tmp_path / 'bf16'}", batch_size=4)
    assert verifier.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert verifier.model.v_head.summary.weight.dtype == torch.float32
    questions, paths = _paths(rows, 3)
    lm = Qwen2ForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16).eval()
    summary = nn.Linear(cfg.hidden_size, 1)  # float32, loaded from the bf16 weights
    summary.load_state_dict({"weight": tensors["v_head.summary.weight"].to(torch.bfloat16),
                             "bias": tensors["v_head.summary.bias"].to(torch.bfloat16)})
    step_id = tok.encode("\n")[-1]
    expected = []
    for q, p in zip(questions, paths):
        ids, ends = tok.encode(tok.bos_token + q + "\n"), []
        for step in p:
            ids = ids + tok.encode(step) + [step_id]
            ends.append(len(ids) - 1)
        with torch.no_grad():
            hidden = lm(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
            values = torch.sigmoid(summary(hidden.float()).squeeze(-1))[0]
        expected.append([values[i].item() for i in ends])
    _close(verifier.score(questions, paths), expected)


# ---- the older adapters refuse a missing head too; auto: ------------------------------------------

def test_token_prm_refuses_a_checkpoint_without_its_classification_head(rows, tmp_path):
    tok = _tokenizer(rows, special=("<extra_0>",))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id, num_labels=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    with pytest.raises(PRMCheckpointError, match=r"missing score\.bias, score\.weight"):
        load_verifier(f"token-prm:{tmp_path / 'lm'}")
    LlamaForTokenClassification(cfg).save_pretrained(tmp_path / "tc")
    tok.save_pretrained(tmp_path / "tc")
    assert load_verifier(f"token-prm:{tmp_path / 'tc'}").score(["q"], [["a", "b"]])


def test_auto_reads_the_family_from_the_checkpoint_and_says_so(qwen, rlhflow, skywork, rows, tmp_path, capsys):
    tok = _tokenizer(rows, special=("ки", "<extra_0>"))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id, num_labels=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "ms")
    tok.save_pretrained(tmp_path / "ms")
    LlamaForTokenClassification(cfg).save_pretrained(tmp_path / "tc")
    tok.save_pretrained(tmp_path / "tc")
    expected = {qwen[0]: "qwen-prm", rlhflow[0]: "rlhflow-prm", skywork[0]: "skywork-prm",
                tmp_path / "ms": "math-shepherd", tmp_path / "tc": "token-prm"}
    for folder, family in expected.items():
        check_spec(f"auto:{folder}")
        verifier = load_verifier(f"auto:{folder}")
        said = capsys.readouterr().err
        assert f"verifier auto:{folder}: read as {family} (" in said, said
        assert verifier.score(["q"], [["a", "b"]]) and len(verifier.score(["q"], [["a", "b"]])[0]) == 2
    assert load_verifier(f"auto:{qwen[0]}").family.name == "qwen-prm"
    # a plain PATH holding a published PRM's own architecture is read as that family too
    for folder, family in ((qwen[0], "qwen-prm"), (skywork[0], "skywork-prm")):
        check_spec(str(folder))
        assert load_verifier(str(folder)).family.name == family
        assert f"read as {family}" in capsys.readouterr().err
    # a causal LM stays a policy by its plain path: the message names the PRM specs to use instead
    with pytest.raises(ValueError, match=f"rlhflow-prm:{rlhflow[0]}"):
        check_spec(str(rlhflow[0]))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    tok.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="no PRM family recognised.*name one: math-shepherd:PATH"):
        check_spec(f"auto:{tmp_path / 'other'}")


# ---- the policy's steps are the PRM's steps, whatever either tokenizer -----------------------------

def _metaspace_tokenizer(rows, special, bos):
    """A SentencePiece-style BPE (Metaspace, no byte fallback): not the policy's byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=["<unk>", "<pad>", *special],
                                  initial_alphabet=[chr(c) for c in range(32, 127)] + ["\n"], show_progress=False)
    tk.train_from_iterator([r["question"] + "\n" + "\n".join(r["steps"]) for r in rows], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>", bos_token=bos)


@pytest.fixture(scope="module")
def rlhflow_metaspace(rows, tmp_path_factory):
    """The RLHFlow stand-in with a SentencePiece-style tokenizer, as Llama checkpoints often have."""
    tok = _metaspace_tokenizer(rows, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                               "<|begin_of_text|>")
    tok.chat_template = LLAMA3
    torch.manual_seed(6)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.3)
    folder = tmp_path_factory.mktemp("rlhflow_sp") / "prm"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, AutoTokenizer.from_pretrained(folder)


def _policy_completion(row):
    """A policy's answer in paragraphs (blank lines), the first paragraph of two lines."""
    first, *rest = row["steps"]
    return "\n\n".join([first + "\nThat is the first result.", *rest])


@pytest.mark.parametrize("family", ["qwen", "rlhflow_metaspace", "skywork"])
def test_policy_steps_map_one_to_one_onto_prm_steps_and_policy_tokens(family, rows, request):
    from reasoning.steps import split_steps
    from rl.step_rewards import assign_rewards, step_end_token_positions

    stand_in = request.getfixturevalue(family)
    folder, prm_tok = stand_in[0], stand_in[1]
    spec = {"qwen": "qwen-prm", "rlhflow_metaspace": "rlhflow-prm", "skywork": "skywork-prm"}[family]
    policy_tok = train_tokenizer([r["question"] + " " + " ".join(r["steps"]) for r in rows[3:]], vocab_size=400)
    row = rows[2]
    text = _policy_completion(row)
    # the two tokenizers cut the same text differently (the policy's splits digits; the PRM's is
    # Qwen's byte-level BPE, or a SentencePiece-style one)
    assert policy_tok.tokenize(text) != prm_tok.tokenize(text)
    steps = split_steps(text).steps
    assert len(steps) == len(row["steps"]) and "\n" in steps[0]
    verifier = load_verifier(f"{spec}:{folder}")
    scores = verifier.score([row["question"]], [steps])[0]
    assert len(scores) == len(steps)
    # the PRM's own procedure on the same steps; Skywork's splits the first step at its "\n" and its
    # score for that policy step is the one at the step's end (its last line)
    if spec == "qwen-prm":
        expected = qwen_card_scores(QwenCardModel(folder, stand_in[2]).eval(), prm_tok, row["question"], steps)
    elif spec == "rlhflow-prm":
        expected = rlhflow_card_scores(LlamaForCausalLM.from_pretrained(folder).eval(), prm_tok, row["question"], steps)
    else:
        per_line = skywork_card_scores(folder, prm_tok, row["question"], steps)
        assert len(per_line) == len(steps) + 1
        expected = per_line[1:]
    _close([scores], [expected])
    # PPO pays step k's score at the policy token holding step k's last character, found here by hand
    ids = policy_tok(text, add_special_tokens=False)["input_ids"]
    decoded, positions = step_end_token_positions(policy_tok, ids)
    assert decoded == text
    by_hand, start = [], 0
    for step in steps:
        last_char = text.index(step, start) + len(step) - 1
        start = last_char + 1
        by_hand.append(next(t for t in range(len(ids)) if len(policy_tok.decode(ids[: t + 1])) > last_char))
    assert positions == by_hand
    # PPO's step reward (`--reward step`) is the family's score, one per policy step
    from rl.rewards import VerifierStepReward

    paid = VerifierStepReward(verifier)([""], [text], question=[row["question"]], steps=[steps])[0]
    assert paid == pytest.approx(scores)
    rewards = assign_rewards(paid, positions, len(ids))
    assert [rewards[t] for t in by_hand] == pytest.approx(scores)
    assert sum(1 for r in rewards if r != 0) == len(steps)
