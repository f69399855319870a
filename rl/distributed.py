"""Where tensors live under each launcher: one process, DDP, DeepSpeed ZeRO-2 and ZeRO-3, FSDP2
(its own module, `rl.fsdp2`, reached through the functions here).

The trainer's loop is the same under every launcher; this module holds what differs:

- `distributed_state()`: the process group, with the gloo backend where DeepSpeed runs without a GPU
  (accelerate would otherwise give every rank a world of one);
- `without_shm_op()`: DeepSpeed without a GPU, minus the shared-memory all-reduce it would compile
  at every process-group init (training never calls it);
- `configure_deepspeed()`: the DeepSpeed settings a PPO run implies (micro-batch, gradient clipping,
  ZeRO-3 bucket sizes that partition small models too), set before `accelerator.prepare`;
- `whole_weights()`: load a frozen model (a verifier, a PRM) unpartitioned under ZeRO-3, so that
  each rank scores on its own without collectives;
- `gathered()`: a module's whole parameters on every rank for the length of a block (generation);
- `full_state_dict()` / `fingerprint()`: the gathered weights, parameter by parameter, to save
  with `save_pretrained` and to check that ranks agree;
- `end_process()`: how a rank of a multi-process launch exits once its run has ended.

Every function that gathers is collective: every rank calls it, in the same order.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager, nullcontext
from typing import NoReturn

import torch

from rl import fsdp2


def log(msg: str) -> None:
    print(f"[ppo_step] {msg}", file=sys.stderr, flush=True)


def end_process(code: int | None) -> NoReturn:
    """Exit with `code`. A rank of a multi-process launch (WORLD_SIZE > 1) exits without the
    interpreter's finalization, its output flushed first: objects that outlive
    `destroy_process_group` (DDP's reducer and FSDP2's mesh hold the gloo backend, whose worker
    threads may still hold tensors) would otherwise be freed while the interpreter is torn down, where
    a C++ thread that needs the GIL is ended by Python mid-frame and the process aborts ('terminate
    called without an active exception', SIGABRT) after its run has finished and written everything.
    A single process exits as usual. Call it only after the run's files are closed and its trackers
    finished (the trainer's `end_training`)."""
    code = 0 if code is None else int(code)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(code)
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def deepspeed_launch() -> bool:
    """True under `accelerate launch` with a DeepSpeed config."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def has_gpu() -> bool:
    return torch.cuda.is_available()


SHM_OP = "deepspeed_shm_comm"


def without_shm_op() -> None:
    """DeepSpeed without a GPU: leave out its shared-memory all-reduce op.

    At every process-group init on a CPU, DeepSpeed loads `deepspeed_shm_comm` through torch's JIT
    extension builder: g++ on first use (about a minute here), and at every later init a file lock in
    torch's extension cache (`~/.cache/torch_extensions/.../deepspeed_shm_comm/lock`). A process
    killed while it holds that lock leaves it behind, and every later DeepSpeed launch on the machine
    then waits on it forever. The op serves only DeepSpeed-inference's tensor-parallel all-reduce
    (`inference_all_reduce`); ZeRO training reduces through the process group (gloo here), so marking
    the op incompatible changes no number of a run and removes the compiler, the lock and the wait.
    A no-op with a GPU or without deepspeed."""
    if has_gpu() or importlib.util.find_spec("deepspeed") is None:
        return
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)  # probed on first access
    if isinstance(compatible, dict):
        compatible[SHM_OP] = False


def distributed_state():
    """accelerate's process state for this launch. DeepSpeed without a GPU runs on the gloo backend:
    accelerate picks no backend there, and each rank would believe it is process 0 of 1."""
    from accelerate import PartialState

    fsdp2.take_over_launch()  # FSDP2: a plain data-parallel state; the trainer shards (rl.fsdp2)
    if deepspeed_launch() and not has_gpu() and int(os.environ.get("LOCAL_RANK", -1)) != -1:
        return PartialState(backend="gloo")  # without_shm_op: done when StepPPOConfig was made
    return PartialState()


def zero_stage(accelerator) -> int:
    """The ZeRO stage of this run (0 without DeepSpeed)."""
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.zero_stage) if plugin is not None else 0


def _auto(config: dict, key: str) -> bool:
    return config.get(key, "auto") == "auto"


def configure_deepspeed(accelerator, micro_batch: int, max_grad_norm: float, hidden_size: int | None) -> list[str]:
    """Fill the DeepSpeed config of this run before `accelerator.prepare` (there is no dataloader to
    take the batch size from) and return what was set, in words:

    - `train_micro_batch_size_per_gpu`: the PPO mini-batch (responses per optimizer step per rank),
      `gradient_accumulation_steps` 1, `train_batch_size` their product with the ranks;
    - `gradient_clipping`: --max_grad_norm, unless the DeepSpeed config sets its own number (the
      engine clips; accelerate's `clip_grad_norm_` does not under DeepSpeed);
    - under ZeRO-3, where the config leaves them unset or "auto", the bucket sizes transformers'
      Trainer derives from the hidden size (so that a small model's matrices are partitioned too;
      DeepSpeed's own persistence threshold keeps every tensor under 100,000 elements whole)."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return []
    config = plugin.deepspeed_config
    said = []
    config["train_micro_batch_size_per_gpu"] = int(micro_batch)
    config["gradient_accumulation_steps"] = 1
    config["train_batch_size"] = int(micro_batch) * accelerator.num_processes
    said.append(f"micro-batch {micro_batch} per rank")
    clip = config.get("gradient_clipping", "auto")
    if clip == "auto" or clip is None:
        config["gradient_clipping"] = float(max_grad_norm)
        said.append(f"gradient clipping {max_grad_norm} (--max_grad_norm)")
    elif float(clip) != float(max_grad_norm):
        said.append(f"gradient clipping {clip} from the DeepSpeed config (not --max_grad_norm {max_grad_norm})")
    zero = config.setdefault("zero_optimization", {})
    if int(zero.get("stage", 0)) == 3 and hidden_size:
        for key, value in (("reduce_bucket_size", hidden_size * hidden_size),
                           ("stage3_prefetch_bucket_size", int(0.9 * hidden_size * hidden_size)),
                           ("stage3_param_persistence_threshold", 10 * hidden_size)):
            if _auto(zero, key):
                zero[key] = value
        said.append(f"ZeRO-3 parameters over {zero['stage3_param_persistence_threshold']} elements partitioned")
    return said


def deepspeed_dtype(accelerator) -> torch.dtype | None:
    """The dtype DeepSpeed trains in (its bf16 or fp16 section), None without DeepSpeed."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return None
    config = plugin.deepspeed_config
    for key, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if str(config.get(key, {}).get("enabled", False)).lower() == "true":
            return dtype
    return torch.float32


def match_trainable_dtype(module, accelerator) -> int:
    """Under DeepSpeed, the trainable parameters that are whole (not partitioned) in the dtype the
    engine trains in: its optimizer flattens every trainable parameter into one buffer of one
    dtype, and peft makes LoRA adapters float32 over a bf16 base that ZeRO-3 loaded. DeepSpeed
    keeps its own float32 master copy. Returns how many were cast."""
    dtype = deepspeed_dtype(accelerator)
    if dtype is None:
        return 0
    cast = 0
    for p in module.parameters():
        if p.requires_grad and not _is_partitioned(p) and p.dtype != dtype and p.is_floating_point():
            p.data = p.data.to(dtype)
            cast += 1
    return cast


@contextmanager
def whole_weights():
    """Models loaded inside are whole on every rank, not partitioned by ZeRO-3's `zero.Init` (which
    transformers applies to every `from_pretrained` while a ZeRO-3 config is registered): a frozen
    verifier scores each rank's own paths, a number of forwards no other rank matches."""
    try:
        import transformers.integrations.deepspeed as hf_ds
    except ImportError:  # pragma: no cover - transformers always has it
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


def partitioned_loading() -> bool:
    """True while `from_pretrained` would partition a model (ZeRO-3 registered with transformers)."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled())


def _zero3_offload(engine):
    """The object of a ZeRO-3 engine that holds its per-module parameter-fetch hooks (None for none)."""
    optimizer = getattr(engine, "optimizer", None)
    return getattr(optimizer, "parameter_offload", optimizer)


@contextmanager
def gathered(module, accelerator, engine=None):
    """A context in which `module`'s parameters are whole on every rank (ZeRO-3), else nothing.

    `engine`: the DeepSpeed engine that trains `module`. Its ZeRO-3 hooks fetch and release each
    submodule's shards around every forward; with the weights already gathered they only cost time,
    once per submodule per generated token (9x slower generation than ZeRO-2 on one H200). With an
    engine given, they are taken off for the block and registered again after it. Under FSDP2 the
    module's shards are all-gathered for the block (`rl.fsdp2.whole`)."""
    if fsdp2.is_sharded(module):
        with fsdp2.whole(module):
            yield
        return
    if zero_stage(accelerator) != 3:
        yield
        return
    import deepspeed

    offload = _zero3_offload(engine)  # None without an engine, or for one that holds no hooks
    if not hasattr(offload, "forward_hooks"):
        offload = None
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        if offload is None:
            yield
            return
        for hook in [*offload.forward_hooks, *offload.backward_hooks]:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload._register_deepspeed_module(offload.module)


def _is_partitioned(p) -> bool:
    return hasattr(p, "ds_id")


@torch.no_grad()
def gathered_state_dict(module, accelerator, only_trainable: bool = False) -> dict[str, torch.Tensor] | None:
    """Under ZeRO-3, `module`'s whole weights on CPU for `save_pretrained(state_dict=...)`,
    gathered one parameter at a time (collective: every rank calls it) and kept on the main
    process; `only_trainable`: the parameters that train (a LoRA adapter's). None where the
    weights are whole already (no ZeRO-3) and on the other ranks. Under FSDP2 the shards gathered
    (`rl.fsdp2.full_state_dict`)."""
    if fsdp2.is_sharded(module):
        return fsdp2.full_state_dict(module, only_trainable=only_trainable)
    if zero_stage(accelerator) != 3:
        return None
    import deepspeed

    keep = accelerator.is_main_process
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        if only_trainable and not p.requires_grad:
            continue
        with deepspeed.zero.GatheredParameters([p]) if _is_partitioned(p) else nullcontext():
            if keep:
                out[name] = p.detach().cpu().clone()
    if keep and not only_trainable:
        saved = set(module.state_dict())  # persistent buffers only (not a rotary table, say)
        for name, b in module.named_buffers():
            if name in saved:
                out[name] = b.detach().cpu().clone()
    return out if keep else None


@torch.no_grad()
def fingerprint(module, accelerator) -> list[float]:
    """Two numbers that change with any weight of `module` (its whole weights, gathered under
    ZeRO-3, all-gathered under FSDP2): the sum and a position-weighted sum of every parameter.
    Collective."""
    total = torch.zeros(2, dtype=torch.float64)
    partitioned = zero_stage(accelerator) == 3
    for k, (_, p) in enumerate(fsdp2.full_parameters(module)):
        context = nullcontext()
        if partitioned and _is_partitioned(p):
            import deepspeed

            context = deepspeed.zero.GatheredParameters([p])
        with context:
            flat = p.detach().double().flatten().cpu()
            total[0] += flat.sum()
            total[1] += (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum() / (k + 1)
    return total.tolist()


def main_process_decides(flag: bool, accelerator) -> bool:
    """Rank 0's `flag` on every rank (a collective when there are several): for decisions every rank
    must take alike, such as stopping a loop on a clock that differs between processes."""
    if accelerator.num_processes == 1:
        return bool(flag)
    from accelerate.utils import broadcast

    t = torch.tensor([1 if flag else 0], device=accelerator.device)
    return bool(broadcast(t, from_process=0).item())


def peak_memory_gib(device) -> float:
    """This process's peak memory so far, GiB: the GPU's allocated peak on CUDA, else the process's
    peak resident set (what a CPU run holds)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
