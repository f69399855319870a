"""What can be checked of `scripts/gpu_smoke.sh` without a GPU: its arguments, and that every
command it would run parses with the project's own config classes (a misspelt flag would only
show on the GPU machine otherwise)."""

import importlib.util
import shlex
import subprocess
from pathlib import Path

from _procs import run_tree

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def dry_commands(*args) -> dict[str, list[str]]:
    done = run("--dry-run", "--model", "/models/smol", "--work", "/tmp/smoke", *args)
    assert done.returncode == 0, done.stderr
    out = {}
    for line in done.stdout.splitlines():
        assert line.startswith("DRY "), line
        name, _, cmd = line[4:].partition(": ")
        out[name] = shlex.split(cmd)
    return out


def test_every_case_is_prepared_and_parses():
    from accelerate.commands.config.config_args import ClusterConfig
    from trl import TrlParser

    from rl.ppo_config import StepPPOConfig

    commands = dry_commands()
    assert list(commands) == ["bf16", "zero2", "zero3", "zero3_gen", "lora", "multinode", "ddp", "fsdp2",
                              "fsdp2_lora", "vllm_rollouts", "vllm_server_start", "vllm_server", "vllm_checks"]
    zero3_gen = commands["zero3_gen"]
    assert zero3_gen[1] == "scripts/gpu_smoke_zero3.py"
    assert zero3_gen[zero3_gen.index("--hidden") + 1] == "576" and zero3_gen[zero3_gen.index("--layers") + 1] == "30"
    stages = {}
    for name, cmd in commands.items():
        if name in ("vllm_checks", "zero3_gen", "vllm_server_start"):
            continue
        split = cmd.index("rl/ppo_step.py")
        launch, ppo = cmd[:split], cmd[split + 1:]
        assert launch[1:3] == ["-m", "accelerate.commands.launch"]
        if "--config_file" in launch:
            config = ClusterConfig.from_yaml_file(str(ROOT / launch[launch.index("--config_file") + 1]))
            stages[name] = (config.deepspeed_config or {}).get("zero_stage") or (config.fsdp_config or {}).get(
                "fsdp_version") and f"fsdp{config.fsdp_config['fsdp_version']}"
        (args,) = TrlParser((StepPPOConfig,)).parse_args_and_config(args=ppo)  # bf16 parses on a CPU too
        args.validate()
        assert args.model_name_or_path == "/models/smol" and args.output_dir == f"/tmp/smoke/{name}"
        assert "--bf16" in ppo and ppo[ppo.index("--bf16") + 1] == "true"
        if name in ("lora", "fsdp2_lora"):
            assert args.use_peft
        if name == "vllm_rollouts":
            assert args.use_vllm
        if name == "vllm_server":
            assert args.use_vllm and args.vllm_mode == "server" and args.vllm_server_url.startswith("http://127.0.0.1")
    assert stages["zero2"] == 2 and stages["zero3"] == 3 and stages["lora"] == 3 and stages["multinode"] == 3
    assert stages["fsdp2"] == stages["fsdp2_lora"] == "fsdp2"
    spec = importlib.util.spec_from_file_location("gpu_smoke_vllm", ROOT / "scripts" / "gpu_smoke_vllm.py")
    vllm_smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vllm_smoke)
    cmd = commands["vllm_checks"]
    parsed = vllm_smoke.parse_args(cmd[cmd.index("scripts/gpu_smoke_vllm.py") + 1:])
    assert parsed.policy == "/models/smol" and parsed.checks == list(vllm_smoke.CHECKS)


def test_only_picks_cases_and_bad_arguments_are_refused():
    assert list(dry_commands("--only", "zero3,vllm_checks")) == ["zero3", "vllm_checks"]
    for bad in (["--only", "zero4"], ["--budget", "ten"], ["--case-limit", "0"], ["--frobnicate"]):
        done = run(*bad)
        assert done.returncode == 2 and "gpu_smoke.sh:" in done.stderr, bad


def test_help_names_the_default_model():
    done = run("--help")
    assert done.returncode == 0 and "outputs/smollm2-135m-instruct" in done.stdout and "SMOKE_MODEL" in done.stdout


def test_the_same_script_runs_its_ppo_cases_on_this_cpu(tmp_path):
    """No GPU here: the script runs its PPO cases with 2 CPU processes (gloo, bf16 autocast) on a
    tiny world policy and prints its table; vLLM's cases are SKIPped where vLLM is not installed.
    One case of each kind runs: one process (bf16), DeepSpeed (zero3), the ZeRO-3 generation script,
    FSDP2 with LoRA, and a colocated vLLM engine. zero2, lora, multinode, ddp and fsdp2 are the same
    `ppo_case` with another launch config: their commands are parsed above
    (test_every_case_is_prepared_and_parses) and those configs run in tests/test_launchers.py."""
    import json
    import os
    import sys

    if importlib.util.find_spec("deepspeed") is None:
        import pytest

        pytest.skip("deepspeed is not installed (scripts/setup_env.sh installs the [deepspeed] extra)")
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate
    from rl.models import build_tiny_causal_lm

    # attention heads of 32 (hidden 64, 2 heads): the smallest the CPU build of vLLM runs
    model, world = tmp_path / "policy", WorldConfig(min_steps=1, max_steps=2)
    rows = generate("train", 50, 0, world)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    build_tiny_causal_lm(tok, hidden_size=64, num_layers=1, num_heads=2, seed=0).save_pretrained(model)
    tok.save_pretrained(model)
    (model / "world_config.json").write_text(json.dumps(world.__dict__))
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    env.pop("ACCELERATE_USE_CPU", None)
    done = run_tree(["bash", str(SCRIPT), "--model", str(model), "--work", str(tmp_path / "work"), "--steps", "2",
                     "--only", "bf16,zero3,zero3_gen,fsdp2_lora,vllm_rollouts"],
                    900, cwd=ROOT, env=env)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert lines[0].startswith("device: cpu")
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["case", "procs", "result"])
    rows = {line.split()[0]: line.split() for line in lines[header + 1:] if line and not line.startswith("total")}
    for case, procs in (("bf16", "1"), ("zero3", "2"), ("fsdp2_lora", "2")):
        assert rows[case][1:3] == [procs, "PASS"], rows[case]
        assert float(rows[case][4]) > 0 and float(rows[case][5]) > 0  # seconds per update, peak memory
    assert rows["zero3_gen"][1:3] == ["1", "PASS"], rows["zero3_gen"]
    assert "tokens equal: True" in next(line for line in lines if line.startswith("zero3_gen"))
    expected = "PASS" if importlib.util.find_spec("vllm") else "SKIP"
    assert rows["vllm_rollouts"][2] == expected
