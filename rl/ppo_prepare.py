"""What the PPO trainer (`rl/ppo_trainer.py`) is built from, once, before its first update: the run's
Accelerator, dropout turned off, the frozen KL reference and where it lives, the critic an estimator
keeps, AdamW and its learning-rate schedule, and the implicit PRMs that --verifier_online_update
trains. The trainer keeps the loop; this module keeps its set-up out of the way of reading it."""

from __future__ import annotations

import copy

import torch

from reward_models.implicit_prm import find_implicit
from rl import distributed as D
from rl import fsdp2, tracking
from rl import ppo_math as M
from rl.ppo_config import StepPPOConfig


def without_dropout(*models) -> None:
    """PPO compares log-probabilities and values of the same weights across forwards (old against
    new, eval against train mode): dropout would make them differ by noise alone."""
    from trl.trainer.utils import disable_dropout_in_model

    for model in models:
        if model is not None:
            disable_dropout_in_model(model)


def make_accelerator(config: StepPPOConfig, policy):
    """The run's Accelerator: --bf16, else the launcher's mixed precision (TrainingArguments reads it
    from accelerate's config; the weights stay float32 either way, rl.ppo_setup._dtype); under
    DeepSpeed its settings made from the PPO settings (rl.distributed.configure_deepspeed)."""
    from accelerate import Accelerator

    precision = run_precision(config)
    # under FSDP2, bf16 is FSDP's own mixed precision (rl.fsdp2.shard), not accelerate's autocast
    accelerator = Accelerator(mixed_precision="no" if fsdp2.settings() else precision,
                              **tracking.accelerator_kwargs(config))
    hidden = getattr(getattr(policy, "config", None), "hidden_size", None)
    said = D.configure_deepspeed(accelerator, config.prompts_per_update * config.num_generations
                                 // config.num_mini_batches, config.max_grad_norm, hidden)
    if said and accelerator.is_main_process:
        D.log(f"DeepSpeed ZeRO-{D.zero_stage(accelerator)}: " + "; ".join(said))
    return accelerator


def run_precision(config: StepPPOConfig) -> str:
    """--bf16, else the launcher's mixed precision ("no", "bf16" or "fp16")."""
    return "bf16" if config.bf16 else getattr(config, "mixed_precision", None) or "no"


def prepared(config: StepPPOConfig, accelerator, model, policy, critic):
    """(model, optimizer, schedule) placed for the launcher: handed to `accelerator.prepare` (DDP,
    DeepSpeed), or under FSDP2 the policy and critic sharded first (`rl.fsdp2.shard`: the optimizer
    must hold the sharded parameters) and nothing handed to accelerate, which would wrap the
    sharded model in DDP; the trainer steps them itself."""
    settings = fsdp2.settings()
    if settings is None:
        optimizer, scheduler = optimizer_and_schedule(config, policy, critic, accelerator)
        return accelerator.prepare(model, optimizer, scheduler)
    parts = [m for m in (policy, critic) if m is not None]
    said = fsdp2.shard(parts, accelerator.device, run_precision(config), settings)
    if accelerator.is_main_process:
        D.log("; ".join(said))
    local, total = fsdp2.held_share(parts)  # every rank says what it holds: the check that it sharded
    D.log(f"FSDP2 rank {accelerator.process_index}: holds {local} of {total} parameter elements (DTensor shards)")
    optimizer, scheduler = optimizer_and_schedule(config, policy, critic, accelerator)
    return model, optimizer, scheduler


def frozen_reference(policy, ref_policy, accelerator, is_peft: bool):
    """The KL reference, frozen: the one given, else (not under LoRA, whose reference is the base
    with its adapters disabled) a copy of the policy, which ZeRO-3's partitioned weights forbid."""
    if ref_policy is not None:
        return ref_policy.requires_grad_(False).eval()
    if is_peft:
        return None
    if D.zero_stage(accelerator) == 3:
        raise ValueError("under ZeRO-3 the policy's weights are partitioned: pass a reference policy loaded "
                         "from its weights (rl.ppo_setup.load_reference), not a copy of the partitioned model")
    return copy.deepcopy(policy).requires_grad_(False).eval()


def placed_reference(ref_policy, accelerator):
    """The reference on this process's device, or in a DeepSpeed inference engine under DeepSpeed."""
    if accelerator.state.deepspeed_plugin is not None:
        from trl.models.utils import prepare_deepspeed

        return prepare_deepspeed(ref_policy, accelerator)
    return ref_policy.to(accelerator.device).eval()


def kept_critic(config: StepPPOConfig, critic):
    """The critic, kept only by an estimator that uses one: for the critic-free ones a critic would
    only cost a model's memory, its forwards and a saved copy (a whole second 7B model on the GPU
    recipes), so none is kept."""
    if not M.ESTIMATORS[config.advantage_estimator].uses_critic:
        return None
    if critic is None:
        raise ValueError(f"--advantage_estimator {config.advantage_estimator} needs a critic")
    return critic


def optimizer_and_schedule(config: StepPPOConfig, policy, critic, accelerator):
    """AdamW over the trainable weights (the critic at its own learning rate) and the learning
    rate schedule over the whole run's optimizer steps."""
    from transformers import get_scheduler

    params = [{"params": [p for p in policy.parameters() if p.requires_grad], "lr": config.learning_rate}]
    if critic is not None:
        params.append({"params": [p for p in critic.parameters() if p.requires_grad],
                       "lr": config.critic_learning_rate or config.learning_rate})
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay,
                                  eps=config.adam_epsilon, betas=(config.adam_beta1, config.adam_beta2))
    unprepared = accelerator.state.deepspeed_plugin is not None or fsdp2.settings() is not None
    total_steps = scheduler_steps(config, accelerator.num_processes, deepspeed=unprepared)
    warmup = config.get_warmup_steps(total_steps) if hasattr(config, "get_warmup_steps") else 0
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                              num_training_steps=total_steps)
    return optimizer, scheduler


def scheduler_steps(config: StepPPOConfig, num_processes: int, deepspeed: bool = False) -> int:
    """Scheduler steps of a whole run. accelerate's prepared scheduler advances `num_processes`
    times per optimizer step (it assumes the batch grew with the processes), so the schedule's
    length is the optimizer steps times the processes, or a linear schedule would end early; under
    DeepSpeed the engine steps the scheduler itself, once per optimizer step, and under FSDP2 the
    trainer steps its unprepared scheduler once per optimizer step (`deepspeed` true for both)."""
    steps = config.max_steps * config.num_iterations * config.num_mini_batches
    return steps if deepspeed else steps * max(1, num_processes)


def online_prms(config: StepPPOConfig, verifier) -> list:
    """The implicit PRMs that --verifier_online_update trains ([] without the flag)."""
    if not config.verifier_online_update:
        return []
    found = find_implicit(verifier)
    if not found:
        raise ValueError("--verifier_online_update needs an implicit PRM verifier (--verifier implicit:PATH)")
    return found
