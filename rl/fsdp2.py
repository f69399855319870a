"""FSDP2 (PyTorch's `fully_shard`) as a launcher of the PPO trainer, on GPUs and on this CPU alike.

`accelerate launch --config_file configs/accelerate/fsdp2.yaml rl/ppo_step.py ...` starts the ranks
with accelerate's FSDP settings in their environment. accelerate turns FSDP on only for GPU-like
distributed types: launched on a CPU it would train unsharded, silently. So the trainer takes the
launch over, one way on every machine:

- `take_over_launch()` (before any accelerate state exists) reads the FSDP settings, refuses what
  it does not run (FSDP1, parameter offload) in one line, and removes `ACCELERATE_USE_FSDP`, so
  that accelerate builds a plain data-parallel process state (gloo on a CPU, NCCL on GPUs);
- `shard()` applies `fully_shard` to every decoder layer of the policy and of the critic, then to
  each of them whole (its embeddings, norm and head): every trained weight is a `DTensor` shard,
  gradients are reduce-scattered (averaged over ranks, as DDP averages them), and bf16 is FSDP's
  `MixedPrecisionPolicy` (bf16 compute over float32 sharded weights, float32 gradient reduction);
- the trainer does not hand the model, optimizer or schedule to `accelerator.prepare` (which would
  wrap the sharded model in DDP): it steps them itself, and checkpoints them with
  `torch.distributed.checkpoint` (`save()` / `load()`: each rank writes its shards);
- `whole()` holds every parameter unsharded for a block (generation: each rank then generates as
  many tokens as its own prompts need, with no collective per token), `full_state_dict()` gathers
  the weights for `save_pretrained`, `full_parameters()` iterates whole parameters (fingerprints).

Every function that gathers is collective: every rank calls it, in the same order.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class FSDP2Settings:
    """What an FSDP2 launch config asks for (read from the environment accelerate launch sets)."""

    reshard_after_forward: bool = True
    layer_classes: tuple[str, ...] = ()
    """Classes to shard one by one (`fsdp_transformer_layer_cls_to_wrap`); empty: the model's own
    `_no_split_modules` (its decoder layer), as accelerate's transformer-based wrap takes them."""
    mixed_precision: str = "no"


_SETTINGS: FSDP2Settings | None = None


def fsdp_launch() -> bool:
    """True under `accelerate launch` with an FSDP config (before `take_over_launch` clears it)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or _SETTINGS is not None


def settings() -> FSDP2Settings | None:
    """The FSDP2 settings of this launch (after `take_over_launch`), None for any other launcher."""
    return _SETTINGS


def check_launch_config() -> None:
    """ValueError, in one line, for an FSDP launch config the trainer does not run."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ValueError(f"the accelerate config asks for FSDP version {version}: the trainer runs FSDP2 only "
                         "(fsdp_version: 2, as in configs/accelerate/fsdp2.yaml)")
    if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
        raise ValueError("the accelerate config sets fsdp_offload_params: true, which the trainer's FSDP2 path does "
                         "not run; set it to false")


def take_over_launch() -> FSDP2Settings | None:
    """Under an FSDP2 launch: its settings, kept for `shard()`, and the environment changed so that
    accelerate builds a plain data-parallel state (`ACCELERATE_USE_FSDP` removed; on a machine
    without a GPU, `ACCELERATE_USE_CPU` set, so that the ranks form one gloo group). Call once,
    before any accelerate state is made. None for any other launcher."""
    global _SETTINGS
    if _SETTINGS is not None:
        return _SETTINGS
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    check_launch_config()
    classes = tuple(c.strip() for c in os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if c.strip())
    _SETTINGS = FSDP2Settings(
        reshard_after_forward=os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() in ("true", "full_shard"),
        layer_classes=classes, mixed_precision=os.environ.get("ACCELERATE_MIXED_PRECISION", "no"))
    os.environ["ACCELERATE_USE_FSDP"] = "false"
    if not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "1"
    return _SETTINGS


def _base(module: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (or the module itself): the root to shard, since
    peft's `generate` calls the base model's forward directly, and FSDP2 needs every forward to
    begin at its root."""
    get_base = getattr(module, "get_base_model", None)
    return get_base() if callable(get_base) else module


def _layer_classes(module: nn.Module, chosen: tuple[str, ...]) -> set[str]:
    return set(chosen) or set(getattr(_base(module), "_no_split_modules", None) or [])


def _mixed_precision(precision: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "fp16":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(parts: list[nn.Module], device: torch.device, precision: str, config: FSDP2Settings) -> list[str]:
    """`fully_shard` over every decoder layer of each module in `parts` (the policy, the critic),
    then over the module whole; call before the optimizer is made (it must hold the sharded
    parameters). Returns what was done, in words. Raises where nothing was sharded."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size() if dist.is_initialized() else 1
    mesh = init_device_mesh(device.type, (world,))
    kwargs = {"mesh": mesh, "mp_policy": _mixed_precision(precision)}
    said = []
    for part in parts:
        classes = _layer_classes(part, config.layer_classes)
        layers = [m for m in part.modules() if type(m).__name__ in classes]
        for layer in layers:
            fully_shard(layer, reshard_after_forward=config.reshard_after_forward, **kwargs)
        fully_shard(_base(part), reshard_after_forward=False, **kwargs)  # the root: gathered again for backward
        said.append(f"{type(part).__name__}: {len(layers)} layers ({', '.join(sorted(classes)) or 'none'})")
    if not all(is_sharded(part) for part in parts):
        raise RuntimeError("FSDP2 left a module unsharded")
    # the critic's head returns its logits as a view; the trainer never changes a model output in
    # place (what torch warns of), so the warning, printed on every forward, says nothing here
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    compute = {"no": "float32"}.get(precision, precision)
    return [f"FSDP2 over {world} ranks, {compute} compute: " + "; ".join(said)]


def held_share(parts: list[nn.Module]) -> tuple[int, int]:
    """(elements of the trained modules' parameters this rank holds, elements of the whole
    parameters): about 1/ranks under FSDP2, everything under DDP."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for part in parts:
        for p in part.parameters():
            total += p.numel()
            local += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return local, total


def _fsdp_modules(module: nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def is_sharded(module: nn.Module | None) -> bool:
    """True where `module` holds FSDP2 shards (`DTensor` parameters)."""
    if module is None:
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


@contextmanager
def whole(module: nn.Module) -> Iterator[None]:
    """`module`'s parameters unsharded on every rank for the block (collective on entry and exit),
    with no resharding after each forward inside it: a rank's forwards inside then need no other
    rank, so ranks may generate different numbers of tokens."""
    mods = _fsdp_modules(module)
    if not mods:
        yield
        return
    roots = {id(m) for m in mods if not any(m is not o and m in set(o.modules()) for o in mods)}
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        config = _SETTINGS or FSDP2Settings()
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(config.reshard_after_forward and id(m) not in roots, recurse=False)


def full_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole parameter) in `named_parameters` order; shards are all-gathered one by one
    (collective)."""
    from torch.distributed.tensor import DTensor

    for name, p in module.named_parameters():
        yield name, (p.full_tensor() if isinstance(p, DTensor) else p)


@torch.no_grad()
def full_state_dict(module: nn.Module, only_trainable: bool = False) -> dict[str, torch.Tensor] | None:
    """`module`'s whole weights on CPU on the main process (None on the others), for
    `save_pretrained(state_dict=...)`; `only_trainable`: the parameters that train (an adapter's).
    Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    params = dict(module.named_parameters())  # a tied weight once, under its first name, as save_pretrained keeps it
    keep = {name for name, p in params.items() if p.requires_grad or not only_trainable}
    if not only_trainable:
        keep |= {name for name, _ in module.named_buffers()}
    return {k: v.detach().clone() for k, v in state.items() if k in keep and isinstance(v, torch.Tensor)}


CHECKPOINT_DIR = "fsdp2_state"
"""A checkpoint's sharded model and optimizer (torch.distributed.checkpoint), beside accelerate's files."""


def save(model: nn.Module, optimizer, scheduler, directory: Path, is_main: bool) -> None:
    """Model and optimizer as each rank's shards, and the schedule, under `directory` (collective);
    nothing outside an FSDP2 launch (accelerate's `save_state` holds them there)."""
    if _SETTINGS is None:
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / CHECKPOINT_DIR))
    if is_main:
        torch.save(scheduler.state_dict(), directory / CHECKPOINT_DIR / "scheduler.pt")


def load(model: nn.Module, optimizer, scheduler, directory: Path) -> None:
    """What `save` wrote, back into the sharded model, its optimizer and the schedule (collective);
    nothing outside an FSDP2 launch."""
    if _SETTINGS is None:
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    where = directory / CHECKPOINT_DIR
    if not where.is_dir():
        raise ValueError(f"{directory}: no {CHECKPOINT_DIR}/ (this checkpoint was not written by an FSDP2 run; "
                         "resume it with the launcher that wrote it)")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(where))  # in place
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    scheduler.load_state_dict(torch.load(where / "scheduler.pt", weights_only=True))
