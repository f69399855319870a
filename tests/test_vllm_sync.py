"""Weight sync into a colocated vLLM V1 engine, against a stand-in engine with the call shape of
vllm 0.31's `LLM` (`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` reaching the
worker's `reload_weights`, which calls the model's `load_weights`; `apply_model`;
`reset_prefix_cache`; `llm_engine.model_executor` in-process). The same sync against a live engine
(the CPU build of vLLM): tests/test_vllm_cpu.py."""

import copy
import sys
import types

import pytest
import torch

from backends.vllm import (
    colocated_engine,
    merged_weights,
    push_weights,
    save_for_vllm,
    sync_policy,
    vllm_weight_name,
)


def tiny_llama(tie=True, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=48, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).eval()


def lora(model, **extra):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: lora_B is not zero, so merging changes the weights
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False, **extra))


def lora_layers(policy):
    return [m for m in policy.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


class StandInModel:
    """Records what vLLM's `model.load_weights` receives, and the policy's state at that moment."""

    def __init__(self, policy=None):
        self.policy = policy
        self.calls = []

    def modules(self):  # what the tied-head refresh walks: no vLLM layers here
        return iter(())

    def load_weights(self, weights):
        weights = list(weights)
        merged = [m.merged for m in lora_layers(self.policy)] if self.policy is not None else []
        self.calls.append(({n: t.detach().clone() for n, t in weights}, merged))
        return {n for n, _ in weights}


class StandInLLM:
    """`vllm.LLM` with its engine core in this process: `llm_engine.model_executor` exists (there is
    no V0 `driver_worker.model_runner`), and `apply_model(fn)` returns `[fn(model)]` per worker."""

    def __init__(self, model, in_process=True):
        self.model = model
        self.llm_engine = types.SimpleNamespace(model_executor=object() if in_process else None)
        if not in_process:
            del self.llm_engine.model_executor
        self.prefix_cache_resets = 0

    def apply_model(self, func):
        return [func(self.model)]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        """`LLM.collective_rpc`: the worker method by name, on each worker (one here)."""
        return [getattr(self, f"_worker_{method}")(*args, **(kwargs or {}))]

    def _worker_reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        """`GPUModelRunner.reload_weights`' signature: checkpoint-format weights go to `load_weights`
        (between vLLM's layer-wise reload hooks, which re-process repacked or quantized layers)."""
        assert weights_iterator is not None and weights_path is None and is_checkpoint_format
        self.reloads = getattr(self, "reloads", 0) + 1
        self.model.load_weights(weights_iterator)

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.prefix_cache_resets += 1
        return True


def test_peft_names_map_back_to_base_names():
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.default") is None
    assert vllm_weight_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_weight_name("base_model.model.lm_head.modules_to_save.other.weight", active={"default"}) is None
    assert vllm_weight_name("base_model.model.lm_head.original_module.weight") is None
    assert vllm_weight_name("model.norm.weight") == "model.norm.weight"


def test_plain_policy_pushes_every_weight_under_its_own_name():
    policy = tiny_llama()
    model = StandInModel()
    llm = StandInLLM(model)
    assert sync_policy(llm, policy) == len(list(policy.named_parameters()))
    (pushed, _), = model.calls
    want = dict(policy.named_parameters())  # a tied lm_head is listed once, as vLLM expects
    assert set(pushed) == set(want) and "lm_head.weight" not in pushed
    for name, tensor in pushed.items():
        assert tensor.shape == want[name].shape and torch.equal(tensor, want[name].detach())
    assert llm.prefix_cache_resets == 1 and llm.reloads == 1  # through reload_weights, not load_weights alone


def test_a_tied_head_is_processed_again_after_the_reload():
    """The CPU build packs the head's weight for its GEMM when the model loads; a tied head is never
    loaded itself (the model skips lm_head), so its processing is run again on the new embedding.
    An untied head (loaded, so processed by the reload) and a quantized one are left alone."""
    from backends.vllm import _refresh_tied_heads

    processed = []

    class UnquantizedEmbeddingMethod:
        def process_weights_after_loading(self, layer):
            processed.append(layer)

    class VocabParallelEmbedding(torch.nn.Module):
        def __init__(self, weight=None):
            super().__init__()
            self.weight = weight if weight is not None else torch.nn.Parameter(torch.randn(8, 4))
            self.quant_method = UnquantizedEmbeddingMethod()

    class ParallelLMHead(VocabParallelEmbedding):
        pass

    class OtherMethod(UnquantizedEmbeddingMethod):
        pass

    model = torch.nn.Module()
    model.embed_tokens = VocabParallelEmbedding()
    model.lm_head = ParallelLMHead(model.embed_tokens.weight)  # tied, as vLLM's tie_weights does
    assert _refresh_tied_heads(model) == 1 and processed == [model.lm_head]
    processed.clear()
    model.lm_head = ParallelLMHead()  # untied
    assert _refresh_tied_heads(model) == 0 and not processed
    model.lm_head = ParallelLMHead(model.embed_tokens.weight)
    model.lm_head.quant_method = OtherMethod()
    assert _refresh_tied_heads(model) == 0 and not processed


def test_lora_is_merged_into_the_pushed_weights_and_the_policy_is_left_unmerged():
    policy = lora(tiny_llama())
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    model = StandInModel(policy)
    llm = StandInLLM(model)
    sync_policy(llm, policy)
    (pushed, merged_during_load), = model.calls
    assert set(pushed) == set(dict(tiny_llama().named_parameters())), "base names, no PEFT tensors"
    assert not any(tok in n for n in pushed for tok in ("lora_", "base_layer", "base_model"))
    for name, tensor in pushed.items():
        assert tensor.shape == expected[name].shape
        assert torch.allclose(tensor, expected[name], atol=1e-6), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(pushed[q], before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    # the adapter is never merged in place: no bf16 merge/unmerge round trip on the frozen base
    assert merged_during_load and not any(merged_during_load)
    assert not any(m.merged for m in lora_layers(policy))
    assert all(torch.equal(p.detach(), before[n]) for n, p in policy.named_parameters())
    assert llm.prefix_cache_resets == 1


def test_dora_is_merged_for_the_push_and_unmerged_after():
    policy = lora(tiny_llama(), use_dora=True)
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    model = StandInModel(policy)
    sync_policy(StandInLLM(model), policy)
    (pushed, merged_during_load), = model.calls
    assert merged_during_load and all(merged_during_load)
    for name, tensor in pushed.items():
        assert torch.allclose(tensor, expected[name], atol=1e-5), name
    assert not any(m.merged for m in lora_layers(policy))
    assert all(torch.allclose(p.detach(), before[n], atol=1e-6) for n, p in policy.named_parameters())


def test_modules_to_save_push_the_trained_copy():
    policy = lora(tiny_llama(tie=False), modules_to_save=["lm_head"])
    with torch.no_grad():
        policy.base_model.model.lm_head.modules_to_save["default"].weight.add_(1.0)
    pushed = dict(merged_weights(policy))
    assert torch.equal(pushed["lm_head.weight"], policy.base_model.model.lm_head.modules_to_save["default"].weight)
    assert not any("original_module" in n or "modules_to_save" in n for n in pushed)


def test_an_engine_core_in_another_process_is_refused():
    with pytest.raises(RuntimeError, match="colocated_engine"):
        push_weights(StandInLLM(StandInModel(), in_process=False), [("x", torch.zeros(1))])


def test_colocated_engine_keeps_the_engine_core_in_this_process(monkeypatch):
    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            import os

            seen.update(kwargs, multiprocessing=os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    colocated_engine("some/dir", seed=3, gpu_memory_utilization=0.25)
    assert seen["multiprocessing"] == "0" and seen["model"] == "some/dir" and seen["seed"] == 3
    assert seen["gpu_memory_utilization"] == 0.25 and "distributed_executor_backend" not in seen


def test_staged_directory_is_the_merged_model(tmp_path):
    from transformers import AutoModelForCausalLM

    policy = lora(tiny_llama())
    expected = copy.deepcopy(policy).merge_and_unload()

    class Tok:
        def save_pretrained(self, directory):
            pass

    save_for_vllm(policy, Tok(), tmp_path / "staged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "staged")
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, expected(ids).logits, atol=1e-5)
    assert not any(m.merged for m in lora_layers(policy))


def test_ppo_vllm_rollouts_stage_sync_then_sample(tmp_path, monkeypatch):
    """The trainer's vLLM path on a stand-in `vllm` module: the engine starts from a staged plain
    model, the policy's weights are pushed before sampling, prompts go as token ids."""
    import trl  # noqa: F401 - imported before the stand-in: trl reads vllm's import spec when it loads
    from tiny_world_policy import make_ppo_trainer

    events = []

    class Output:
        def __init__(self, ids):
            self.token_ids, self.finish_reason = ids, "stop"

    class EngineLLM(StandInLLM):
        def __init__(self, **kwargs):
            events.append(("start", kwargs["model"], kwargs["gpu_memory_utilization"]))
            super().__init__(StandInModel())
            self.model.load_weights = lambda weights: events.append(("load", len(list(weights))))

        def reset_prefix_cache(self, *args):
            events.append(("reset",))

        def generate(self, inputs, params, use_tqdm=True):
            events.append(("generate", inputs))
            return [types.SimpleNamespace(outputs=[Output([7, 8])]) for _ in inputs]

    fake = types.SimpleNamespace(LLM=EngineLLM, SamplingParams=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    trainer, args = make_ppo_trainer(tmp_path, use_vllm=True, vllm_gpu_memory_utilization=0.2)
    prompts = ["Question: 1 + 2?", "Question: 3 + 4?"]
    out = trainer.sampler.generate_vllm(prompts)
    trainer.sampler.generate_vllm(prompts)
    staged = tmp_path / "run" / "vllm_policy"
    assert (staged / "model.safetensors").exists() and (staged / "config.json").exists()
    kinds = [e[0] for e in events]
    assert kinds == ["start", "load", "reset", "generate", "load", "reset", "generate"]
    assert events[0][1:] == (str(staged), 0.2)
    n_weights = len(list(trainer._unwrapped_policy().named_parameters()))
    assert events[1][1] == n_weights
    tok = trainer.tokenizer
    assert events[3][1] == [{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts]
    assert out == [[7, 8, tok.eos_token_id]] * 2  # a stop without EOS in the ids gets the EOS the hf path keeps
