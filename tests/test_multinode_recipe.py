"""The multi-node recipe is consistent: accelerate's own config class reads the launch config,
StepPPOConfig (through TRL's parser, as `rl/ppo_step.py` does) reads the PPO recipe, and the two
agree with each other and with the memory arithmetic in docs/gpu.md."""

from pathlib import Path

import pytest
import yaml

from rl.ppo_config import StepPPOConfig

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = ROOT / "configs" / "accelerate" / "zero3_multinode.yaml"
RECIPE = ROOT / "configs" / "ppo" / "multinode_7b_prm.yaml"
GPUS_PER_MACHINE = 8
GPU_MEMORY_GB = 80

# Parameter counts the arithmetic of docs/gpu.md uses (Qwen2.5-Math-7B-Instruct, Math-Shepherd Mistral-7B).
POLICY_PARAMS = 7.62e9
LM_HEAD_PARAMS = 3584 * 152064  # untied in Qwen2.5-7B; the critic has a one-label head instead
PRM_PARAMS = 7.24e9


def cluster():
    from accelerate.commands.config.config_args import ClusterConfig

    return ClusterConfig.from_yaml_file(str(ACCELERATE))


def recipe():
    from trl import TrlParser

    # TrainingArguments refuses bf16 without a GPU: parse with it off, then read the file's value
    (cfg,) = TrlParser((StepPPOConfig,)).parse_args_and_config(args=["--config", str(RECIPE), "--bf16", "false"])
    cfg.validate()
    return cfg, yaml.safe_load(RECIPE.read_text())


def test_launch_config_is_zero3_bf16_over_whole_machines():
    c = cluster()
    assert c.distributed_type == "DEEPSPEED" and c.deepspeed_config["zero_stage"] == 3
    assert c.num_machines >= 2 and c.num_processes == c.num_machines * GPUS_PER_MACHINE
    assert c.machine_rank == 0 and c.main_process_port and c.rdzv_backend == "static"
    assert c.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
    assert c.deepspeed_config["offload_optimizer_device"] == c.deepspeed_config["offload_param_device"] == "none"
    assert c.deepspeed_config["zero3_save_16bit_model"] is True
    assert c.mixed_precision == "bf16"


def test_recipe_matches_the_launch_config_and_the_placement():
    c = cluster()
    cfg, raw = recipe()
    assert raw["bf16"] is True and cfg.dtype == "bfloat16"  # bf16 weights, as mixed_precision says
    assert cfg.use_peft is False  # full fine-tuning: the reference is a separate frozen copy
    assert cfg.critic_init == "policy" and cfg.advantage_estimator == "gae"
    assert cfg.verifier.startswith("math-shepherd:") and "7b" in cfg.verifier.lower()
    assert "7B" in cfg.model_name_or_path and cfg.gradient_checkpointing
    per_process = cfg.prompts_per_update * cfg.num_generations
    assert per_process % cfg.num_mini_batches == 0
    assert per_process * c.num_processes == 256  # the responses per update docs/gpu.md states
    assert cfg.build_missing is False and isinstance(cfg.use_vllm, bool)


def per_gpu_memory_gb(n_gpus: int, responses_per_minibatch: int, tokens: int) -> dict[str, float]:
    """The arithmetic of docs/gpu.md (GB = 1e9 bytes): trained modules at 16 bytes per parameter
    (bf16 weight and gradient, fp32 master weight, Adam m and v) sharded over n_gpus; the frozen
    reference in bf16 sharded; the PRM in bf16 whole on every GPU; the policy gathered whole for
    generation; activations with gradient checkpointing (layer inputs of policy and critic, logits
    in bf16 plus fp32 log-softmax and its gradient)."""
    critic = POLICY_PARAMS - LM_HEAD_PARAMS
    seq_tokens = responses_per_minibatch * tokens
    layer_inputs = 2 * 28 * seq_tokens * 3584 * 2  # policy and critic, 28 layers, hidden 3584, bf16
    logits = seq_tokens * 152064 * (2 + 4 + 4)
    return {
        "trained": (POLICY_PARAMS + critic) * 16 / n_gpus / 1e9,
        "reference": POLICY_PARAMS * 2 / n_gpus / 1e9,
        "prm": PRM_PARAMS * 2 / 1e9,
        "gathered_policy": POLICY_PARAMS * 2 / 1e9,
        "activations": (layer_inputs + logits) / 1e9,
    }


def test_memory_arithmetic_fits_and_is_the_docs_s():
    c = cluster()
    cfg, _ = recipe()
    m = per_gpu_memory_gb(c.num_processes, cfg.prompts_per_update * cfg.num_generations // cfg.num_mini_batches,
                          256 + cfg.max_completion_length)
    resident = m["trained"] + m["reference"] + m["prm"]
    generation_peak = resident + m["gathered_policy"]
    training_peak = resident + m["activations"]
    assert max(generation_peak, training_peak) < GPU_MEMORY_GB * 0.75  # room for buffers and fragmentation
    page = (ROOT / "docs" / "gpu.md").read_text()
    for value in (m["trained"], m["reference"], m["prm"], m["gathered_policy"], m["activations"],
                  generation_peak, training_peak):
        assert f"{value:.1f} GB" in page, f"{value:.1f} GB not in the arithmetic of docs/gpu.md"


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_every_launch_config_reads(path):
    from accelerate.commands.config.config_args import ClusterConfig

    c = ClusterConfig.from_yaml_file(str(path))
    if c.distributed_type == "DEEPSPEED":
        assert f"zero{c.deepspeed_config['zero_stage']}" in path.name
    assert c.num_processes % c.num_machines == 0
