"""What can be checked of `scripts/gpu_smoke.sh` without a GPU: its arguments, and that every
command it would run parses with the project's own config classes (a misspelt flag would only
show on the GPU machine otherwise)."""

import importlib.util
import shlex
import subprocess
from pathlib import Path

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
    assert list(commands) == ["bf16", "zero2", "zero3", "lora", "vllm_rollouts", "ddp", "vllm_checks"]
    stages = {}
    for name, cmd in commands.items():
        if name == "vllm_checks":
            continue
        split = cmd.index("rl/ppo_step.py")
        launch, ppo = cmd[:split], cmd[split + 1:]
        assert launch[1:3] == ["-m", "accelerate.commands.launch"]
        if "--config_file" in launch:
            config = ClusterConfig.from_yaml_file(str(ROOT / launch[launch.index("--config_file") + 1]))
            stages[name] = (config.deepspeed_config or {}).get("zero_stage")
        # TrainingArguments refuses bf16 on a machine without a GPU: parse with it off
        (args,) = TrlParser((StepPPOConfig,)).parse_args_and_config(args=ppo + ["--bf16", "false"])
        args.validate()
        assert args.policy == "/models/smol" and args.output_dir == f"/tmp/smoke/{name}"
        assert "--bf16" in ppo and ppo[ppo.index("--bf16") + 1] == "true"
        if name == "lora":
            assert args.use_peft
        if name == "vllm_rollouts":
            assert args.rollout_backend == "vllm"
    assert stages["zero2"] == 2 and stages["zero3"] == 3 and stages["lora"] == 2
    spec = importlib.util.spec_from_file_location("gpu_smoke_vllm", ROOT / "scripts" / "gpu_smoke_vllm.py")
    vllm_smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vllm_smoke)
    cmd = commands["vllm_checks"]
    parsed = vllm_smoke.parse_args(cmd[cmd.index("scripts/gpu_smoke_vllm.py") + 1:])
    assert parsed.policy == "/models/smol" and parsed.checks == list(vllm_smoke.CHECKS)


def test_only_picks_cases_and_bad_arguments_are_refused():
    assert list(dry_commands("--only", "zero3,vllm_checks")) == ["zero3", "vllm_checks"]
    for bad in (["--only", "zero4"], ["--budget", "ten"], ["--frobnicate"]):
        done = run(*bad)
        assert done.returncode == 2 and "gpu_smoke.sh:" in done.stderr, bad


def test_help_names_the_default_model():
    done = run("--help")
    assert done.returncode == 0 and "outputs/smollm2-135m-instruct" in done.stdout and "SMOKE_MODEL" in done.stdout
