"""The scale path on this CPU: every launch config in configs/accelerate/ runs the PPO trainer end to
end with 2 processes (DDP on gloo, DeepSpeed ZeRO-2 and ZeRO-3 on gloo, the two-machine ZeRO-3
recipe as 2 local processes), full fine-tuning and LoRA, with a critic and without, a model
verifier's step reward and the answer check, progress rewards and Monte Carlo values with ranks
doing unequal work; the launchers agree on the policy after the same
updates; what each saves loads with `from_pretrained` and decodes as the trainer did; a rank killed
mid-run stops the other within seconds and the run resumes to the uninterrupted policy; bf16 is
mixed precision that trains.

The 2-process runs take 15-45 s each on 2 cores (DeepSpeed's shared-memory op, which it would
compile with g++, is left out on a CPU: rl.distributed.without_shm_op)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from _procs import kill_tree, run_tree

from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, generate

ROOT = Path(__file__).resolve().parents[1]
ACCEL = ROOT / "configs" / "accelerate"
WORLD = WorldConfig(min_steps=1, max_steps=2)

pytestmark = pytest.mark.slow


def _has_deepspeed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


needs_deepspeed = pytest.mark.skipif(not _has_deepspeed(), reason="deepspeed is not installed "
                                     "(scripts/setup_env.sh installs the [deepspeed] extra)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny policy (hidden size 32: under ZeRO-3 every matrix over 320 elements is partitioned)
    and a PSV initialised from it."""
    from reasoning.tokenizer import train_tokenizer
    from reward_models.psv import init_psv_from_policy
    from rl.models import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("launch_models")
    policy = root / "policy"
    rows = generate("train", 200, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(policy)
    tok.save_pretrained(policy)
    (policy / "world_config.json").write_text(json.dumps(WORLD.__dict__))
    psv, psv_tok = init_psv_from_policy(str(policy))
    psv.save_pretrained(root / "psv")
    psv_tok.save_pretrained(root / "psv")
    (root / "psv" / "psv_config.json").write_text(json.dumps({"init_from": str(policy)}))
    return root


def ppo_args(models, out, *extra):
    """A verifier's step reward with a critic (GAE), 2 updates, a checkpoint after each, greedy
    evaluation before and after and the probe at every update; a flag in `extra` overrides."""
    return ["--reward", "step", "--advantage_estimator", "gae", "--critic_warmup_updates", "0",
            "--model_name_or_path", str(models / "policy"), "--verifier", str(models / "psv"),
            "--output_dir", str(out), "--build_missing", "false", "--max_steps", "2", "--prompts_per_update", "4",
            "--num_generations", "2", "--n_prompts", "16", "--n_eval", "6", "--max_completion_length", "24",
            "--num_mini_batches", "2", "--num_iterations", "1", "--save_steps", "1", "--disable_tqdm", "true",
            "--learning_rate", "1e-3", "--num_threads", "1", "--n_probe", "4", "--probe_every", "1", *extra]


LAUNCHERS = {
    # name: (accelerate launch arguments, environment): every shipped config, 2 processes on this CPU
    "ddp": (["--config_file", str(ACCEL / "ddp.yaml"), "--num_processes", "2"], {"ACCELERATE_USE_CPU": "1"}),
    "zero2": (["--config_file", str(ACCEL / "zero2.yaml"), "--num_processes", "2"], {}),
    "zero3": (["--config_file", str(ACCEL / "zero3.yaml"), "--num_processes", "2"], {}),
    "fsdp2": (["--config_file", str(ACCEL / "fsdp2.yaml"), "--num_processes", "2"], {}),
}


def launch_cmd(launcher: list[str], args: list[str]) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", *launcher, str(ROOT / "rl" / "ppo_step.py"), *args]


def env_for(extra: dict[str, str]) -> dict[str, str]:
    # PYTHONFAULTHANDLER: a rank that dies of a signal (a C++ abort has no traceback) prints every
    # thread's Python stack first, so a failure says where it happened
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
    env.pop("ACCELERATE_USE_CPU", None)
    env.update(extra)
    return env


NATIVE_CRASH = re.compile(r"exitcode\s*:\s*-(6|7|11)\b")
"""A rank that died of SIGABRT, SIGBUS or SIGSEGV (torch's elastic agent reports each rank's exit code)."""


def crash_report(stderr: str) -> str:
    """What a launch's stderr says of a failure: the ranks' error lines, then each faulthandler stack."""
    said = ("[rank", "Error", "terminate called", "what():", "Abort", "Exception")  # a C++ abort has no traceback
    lines = stderr.splitlines()
    rank_lines = [line for line in lines if any(word in line for word in said)]
    stacks: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):  # faulthandler: the runtime's state, then each thread's stack
            block = [x[:300] for x in lines[i:i + 60] if not x.startswith("Extension modules")]
            stacks.extend(block)
    return "\n".join(rank_lines)[-3000:] + "\n---\n" + "\n".join(stacks)[:6000] + "\n---\n" + stderr[-2000:]


def launch(launcher: list[str], env: dict[str, str], args: list[str], timeout: int = 600, retry_crash: bool = True):
    """A 2-process launch that must end with exit 0. A rank killed by a native crash (no Python
    error) is run once more from a fresh output folder, with a warning that carries its stacks. Such
    a crash was seen in two CI runs (2026-12: rank 1 of an FSDP2 launch, then of a DDP one, 'terminate
    called without an active exception') and in none of 39 local runs of those launches; a second
    crash, or any Python error, fails the test. rl.distributed.end_process is the fix tried for it."""
    done = run_tree(launch_cmd(launcher, args), timeout, env=env_for(env), cwd=ROOT)
    if done.returncode != 0 and retry_crash and NATIVE_CRASH.search(done.stderr) and "--output_dir" in args:
        warnings.warn("a rank died of a native crash; the launch runs once more:\n" + crash_report(done.stderr),
                      stacklevel=2)
        out = Path(args[args.index("--output_dir") + 1])
        if out.exists():
            shutil.rmtree(out)
        done = run_tree(launch_cmd(launcher, args), timeout, env=env_for(env), cwd=ROOT)
    assert done.returncode == 0, crash_report(done.stderr)
    return done


def test_a_rank_of_a_multi_process_launch_exits_with_its_code_and_output_but_no_interpreter_teardown():
    """rl.distributed.end_process: under WORLD_SIZE > 1 the exit code and the buffered output
    survive, the interpreter's teardown (here an atexit handler) does not run; one process exits as usual."""
    code = ("import atexit, sys; atexit.register(lambda: print('teardown')); from rl.distributed import end_process; "
            "print('ran'); sys.stderr.write('said'); end_process(int(sys.argv[1]) or None)")
    for world, exit_code, teardown in (("2", 3, False), ("2", 0, False), ("1", 3, True)):
        done = subprocess.run([sys.executable, "-c", code, str(exit_code)], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, WORLD_SIZE=world, PYTHONPATH=str(ROOT)), cwd=ROOT)
        assert done.returncode == exit_code, (world, done.stderr[-2000:])
        assert done.stdout.splitlines() == (["ran", "teardown"] if teardown else ["ran"]) and "said" in done.stderr


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def float32(launcher: str) -> list[str]:
    """The launcher's arguments with mixed precision off (the shipped configs ask for bf16)."""
    return [*LAUNCHERS[launcher][0], "--mixed_precision", "no"]


@pytest.fixture(scope="module")
def float32_runs(models, tmp_path_factory):
    """The same run (seed, prompts, 2 updates) under DDP, ZeRO-2 and ZeRO-3, 2 processes, float32."""
    if not _has_deepspeed():
        pytest.skip("deepspeed is not installed")
    root = tmp_path_factory.mktemp("float32_runs")
    outs = {}
    for name in LAUNCHERS:
        outs[name] = root / name
        done = launch(float32(name), LAUNCHERS[name][1], ppo_args(models, outs[name]))
        (root / f"{name}.stderr").write_text(done.stderr)
    return outs


@needs_deepspeed
def test_fsdp2_on_a_cpu_shards_for_real(float32_runs):
    """accelerate turns FSDP on only for GPU-like devices: launched on a CPU it would train unsharded,
    silently. Under the trainer's FSDP2 path each rank holds half of the policy's and critic's
    parameter elements (DTensor shards; an odd-sized dimension splits one apart), and says so."""
    stderr = (float32_runs["fsdp2"].parent / "fsdp2.stderr").read_text()
    held = {}
    for line in stderr.splitlines():
        if "FSDP2 rank " in line and "holds" in line:
            words = line.split("FSDP2 rank ", 1)[1].split()
            held[int(words[0].rstrip(":"))] = (int(words[2]), int(words[4]))
    assert sorted(held) == [0, 1], stderr[-2000:]
    total = held[0][1]
    assert held[1][1] == total and held[0][0] + held[1][0] == total
    assert all(abs(local - total / 2) <= 0.01 * total for local, _ in held.values()), held
    ddp = (float32_runs["ddp"].parent / "ddp.stderr").read_text()
    assert "FSDP2 rank" not in ddp


@needs_deepspeed
def test_every_launcher_runs_a_verifier_reward_with_a_critic_checkpoints_evaluation_and_probes(float32_runs):
    for name, out in float32_runs.items():
        result = json.loads((out / "eval.json").read_text())
        assert result["processes"] == 2 and result["updates"] == 2, name
        assert result["n"] == 6, name  # the greedy evaluation of every problem, before and after
        assert {int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")} == {1, 2}, name
        rows = metrics(out)
        assert [r["update"] for r in rows] == [0, 1, 2], name  # the first probe, then every update
        assert all("probe/greedy_accuracy" in r for r in rows), name
        # the reference is the policy's starting weights: the first update's KL to it is nothing
        assert rows[1]["objective/kl"] == pytest.approx(0.0, abs=1e-6), name
        assert rows[1]["verifier/mean_step_score"] > 0 or rows[1]["rollout/no_steps_frac"] == 1.0
        assert (out / "critic" / "model.safetensors").exists(), name


@needs_deepspeed
def test_launchers_agree_on_the_policy_after_the_same_updates(float32_runs, models):
    """ZeRO-3 and FSDP2 partition the parameters and reduce-scatter the gradients (summing in
    another order than DDP's all-reduce, and FSDP2's clipping norm is a sum of per-shard norms),
    and ZeRO-2 sums the gradient norm that clipping divides by partition by partition, so all three
    round apart from DDP (ZeRO-2 by one or two
    ulps, 7.5e-9 at most, once the default step reward's gradients are clipped). The tolerance,
    1e-5 on every weight, is 0.25% of how far a weight moved (Adam at lr 1e-3 for 4 steps: about
    4e-3) and about 50 times the largest difference measured (1.7e-7)."""
    from safetensors.torch import load_file

    start = load_file(str(models / "policy" / "model.safetensors"))
    policies = {name: load_file(str(out / "policy" / "model.safetensors")) for name, out in float32_runs.items()}
    for name, weights in policies.items():
        assert set(weights) == set(start), name  # whole weights, nothing extra (no rotary tables)
        assert all(weights[k].shape == start[k].shape for k in start), name
        moved = max((weights[k] - start[k]).abs().max().item() for k in start)
        assert moved > 1e-3, (name, moved)  # the comparison below is not between untouched copies
    for name in ("zero2", "zero3", "fsdp2"):
        diff = max((policies[name][k] - policies["ddp"][k]).abs().max().item() for k in start)
        assert diff <= 1e-5, (name, diff)


@needs_deepspeed
def test_ddp_and_zero2_agree_to_the_bit_where_clipping_does_not_bind(models, tmp_path):
    """Without clipping, DDP and ZeRO-2 reduce the same gradients in the same order: the policies
    after the same updates are equal to the bit."""
    from safetensors.torch import load_file

    policies = {}
    for name in ("ddp", "zero2"):
        launch(float32(name), LAUNCHERS[name][1], ppo_args(models, tmp_path / name, "--max_grad_norm", "1e9"))
        policies[name] = load_file(str(tmp_path / name / "policy" / "model.safetensors"))
    start = load_file(str(models / "policy" / "model.safetensors"))
    assert max((policies["ddp"][k] - start[k]).abs().max().item() for k in start) > 1e-3  # it trained
    assert all(torch.equal(policies["zero2"][k], policies["ddp"][k]) for k in start)


@needs_deepspeed
def test_a_saved_policy_reloads_and_decodes_as_the_trainer_did(float32_runs):
    """Each saved policy/ loads with from_pretrained, gives the greedy completions the trainer's
    own final evaluation wrote, and has the fingerprint the trainer recorded for every rank (an
    empty ZeRO-3 save, or a fingerprint of shards, would fail here)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.hf import HFGenerator
    from reasoning.problem_sets import WorldDraw, load_problem_set
    from reasoning.world import world_config_of
    from rl.greedy_accuracy import greedy_rows

    for name, out in float32_runs.items():
        policy = AutoModelForCausalLM.from_pretrained(str(out / "policy")).eval()
        tok = AutoTokenizer.from_pretrained(str(out / "policy"))
        config = json.loads((out / "run_config.json").read_text())
        world = WorldDraw(split="test", n=6, seed=config.get("world_seed", 0),
                          config=world_config_of(str(out / "policy")))
        problems = load_problem_set("world", role="eval", limit=6, world=world).problems
        rows = greedy_rows(HFGenerator(policy, tok, batch_size=100), problems, max_new_tokens=24)
        trained = [json.loads(line) for line in (out / "eval_after_rows.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == [r["id"] for r in trained], name
        assert [r["completion"] for r in rows] == [r["completion"] for r in trained], name
        hashes = json.loads((out / "policy_hashes.json").read_text())
        assert len(hashes) == 2 and len(set(hashes.values())) == 1, (name, hashes)
        assert_fingerprint(hashes["0"], policy, name)


def assert_fingerprint(recorded: str, model, name: str) -> None:
    """`recorded` (rl.distributed.fingerprint's 'sum/position-weighted sum') is `model`'s weights'."""
    total = torch.zeros(2, dtype=torch.float64)
    for k, p in enumerate(model.parameters()):
        flat = p.detach().double().flatten()
        total[0] += flat.sum()
        total[1] += (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum() / (k + 1)
    a, b = (float(x) for x in recorded.split("/"))
    assert a == pytest.approx(total[0].item(), rel=1e-9) and b == pytest.approx(total[1].item(), rel=1e-9), name


@needs_deepspeed
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_lora_with_a_critic_and_the_answer_check_in_bf16_under_each_shipped_config(models, tmp_path, launcher):
    """LoRA on the policy and on the critic (its value head trained whole), the answer check, with
    each config's own mixed precision (bf16: autocast under DDP, DeepSpeed's bf16 with float32
    master weights under ZeRO; under ZeRO-3 the float32 adapters over the bf16 base that ZeRO-3
    loaded are put in one dtype for DeepSpeed's flat buffer). Rollouts are decoded by the loop
    (--hf_decoding loop) inside each launcher's gather (ZeRO-3's gathered weights, FSDP2's unsharded
    ones), each rank to its own rows' ends; the float32 runs above decode with `generate`."""
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file

    out = tmp_path / launcher
    launch(*LAUNCHERS[launcher], ppo_args(models, out, "--use_peft", "true", "--lora_r", "4", "--reward", "gold",
                                          "--learning_rate", "1e-2", "--hf_decoding", "loop"))
    assert json.loads((out / "eval.json").read_text())["processes"] == 2
    adapter = load_file(str(out / "policy" / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.numel() for v in lora_b)  # not the empty tensors of a partitioned save
    assert max(v.abs().max().item() for v in lora_b) > 0  # LoRA B starts at zero: it trained
    model = AutoPeftModelForCausalLM.from_pretrained(str(out / "policy"))
    assert model.peft_config["default"].r == 4
    critic = load_file(str(out / "critic" / "adapter_model.safetensors"))
    head = [v for k, v in critic.items() if k.endswith("score.weight")]
    assert len(head) == 1 and head[0].shape == (1, 32)  # the value head, whole


CONTINUATIONS = {"zero3": ("--reward", "gold+progress", "--progress_rollouts", "2"),  # PAV's progress, --prover policy
                 "fsdp2": ("--reward", "gold", "--advantage_estimator", "mc_values", "--mc_rollouts", "2")}  # VinePPO


@needs_deepspeed
@pytest.mark.parametrize("launcher", list(CONTINUATIONS))
def test_continuations_sample_on_each_rank_however_unequal_the_ranks_work(models, tmp_path, launcher):
    """Progress rewards and Monte Carlo values sample continuations with `generate` from each rank's
    own responses' step boundaries, so the ranks make different numbers of calls, a rank with no
    boundaries none. Under ZeRO-3 and FSDP transformers syncs every `generate` across ranks by
    default (synced_gpus), and a rank with fewer calls hung the others: the second update of both
    runs here, before the trainer turned the sync off for its whole (gathered) weights. The greedy
    evaluation of one problem leaves one rank nothing to decode."""
    out = tmp_path / launcher
    launch(float32(launcher), LAUNCHERS[launcher][1],
           ppo_args(models, out, *CONTINUATIONS[launcher], "--n_eval", "1"), timeout=240)
    requests = [row["continuations/requests"] for row in metrics(out)[1:]]  # the mean over the 2 ranks
    assert len(requests) == 2 and any(r != int(r) for r in requests), requests  # the ranks' work differed
    result = json.loads((out / "eval.json").read_text())
    assert result["processes"] == 2 and result["updates"] == 2 and result["n"] == 1


def test_an_online_prm_stays_one_model_on_every_rank(models, tmp_path):
    """PRIME's online implicit PRM (--verifier_online_update): each rank holds a whole copy and
    updates it on its own rollouts, the gradients averaged over ranks, so the copies stay equal:
    after 2 updates both ranks' fingerprints of it, saved with it, are the same, and are those of
    the saved weights, which moved from the start."""
    from transformers import AutoModelForCausalLM

    from reward_models.implicit_prm import load_for_training

    load_for_training(str(models / "policy"), beta=0.1).save_pretrained(str(tmp_path / "prm"))
    out = tmp_path / "prime"
    launch(float32("ddp"), LAUNCHERS["ddp"][1],
           ppo_args(models, out, "--reward", "outcome", "--verifier", f"implicit:{tmp_path / 'prm'}",
                    "--verifier_online_update", "true", "--verifier_online_learning_rate", "1e-2",
                    "--max_completion_length", "40"))
    assert all(row["verifier/online_paths"] > 0 for row in metrics(out)[1:])  # both updates trained it
    saved = json.loads((out / "implicit_prm" / "implicit_prm.json").read_text())
    hashes = saved["rank_fingerprints"]
    assert saved["online_updates"] == 2 and len(hashes) == 2 and len(set(hashes.values())) == 1, hashes
    prm = AutoModelForCausalLM.from_pretrained(str(out / "implicit_prm"))
    assert_fingerprint(hashes["0"], prm, "prime")
    start = AutoModelForCausalLM.from_pretrained(str(tmp_path / "prm"))
    assert max((a - b).abs().max().item() for a, b in zip(prm.parameters(), start.parameters())) > 1e-4


@needs_deepspeed
def test_the_two_machine_zero3_recipe_runs_as_two_local_processes(models, tmp_path):
    out = tmp_path / "multinode"
    launcher = ["--config_file", str(ACCEL / "zero3_multinode.yaml"), "--num_machines", "1", "--num_processes", "2",
                "--machine_rank", "0", "--main_process_ip", "127.0.0.1"]
    done = launch(launcher, {}, ppo_args(models, out, "--reward", "gold", "--advantage_estimator", "group"))
    assert "ZeRO-3" in done.stderr and "partitioned" in done.stderr
    assert json.loads((out / "eval.json").read_text())["processes"] == 2
    assert (out / "policy" / "model.safetensors").exists()


def test_the_two_machine_fsdp2_recipe_runs_as_two_local_processes(models, tmp_path):
    """Also the token budget over 2 processes: rollout/tokens_cumulative counts both ranks' responses
    (the per-response mean times the 16 responses an update samples over both ranks), and a budget
    the first update passes ends the run after it on both ranks, its policy and evaluation written."""
    out = tmp_path / "multinode"
    launcher = ["--config_file", str(ACCEL / "fsdp2_multinode.yaml"), "--num_machines", "1", "--num_processes", "2",
                "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--mixed_precision", "no"]
    done = launch(launcher, {}, ppo_args(models, out, "--reward", "gold", "--advantage_estimator", "group",
                                         "--max_steps", "3", "--max_generated_tokens", "1"))
    assert "FSDP2 over 2 ranks" in done.stderr and "FSDP2 rank 1: holds" in done.stderr
    result = json.loads((out / "eval.json").read_text())
    assert result["processes"] == 2
    assert (out / "policy" / "model.safetensors").exists()
    rows = [row for row in metrics(out) if "rollout/tokens_cumulative" in row]
    assert len(rows) == 1 and "stopping after update 1 of 3" in done.stderr
    assert "--max_generated_tokens 1" in done.stderr
    responses = 4 * 2 * 2  # prompts per update per process x samples x processes
    assert rows[0]["rollout/tokens_cumulative"] == pytest.approx(rows[0]["rollout/response_tokens"] * responses)
    assert result["generated_tokens"] == pytest.approx(rows[0]["rollout/tokens_cumulative"])


@needs_deepspeed
def test_the_readmes_gpu_recipe_runs_with_its_own_config_files(models, tmp_path):
    """README's GPU recipe (configs/accelerate/zero2.yaml with configs/ppo/gpu_qwen_math.yaml: LoRA,
    bf16, a critic, delta-shaped step rewards, adaptive KL, gradient checkpointing) on 2 CPU
    processes, with the tiny policy, a PSV and world prompts in place of the Hub's models and data."""
    out = tmp_path / "recipe"
    args = ["--config", str(ROOT / "configs" / "ppo" / "gpu_qwen_math.yaml"), "--model_name_or_path",
            str(models / "policy"), "--verifier", str(models / "psv"), "--dataset", "world", "--eval_dataset", "world",
            "--n_prompts", "16", "--n_eval", "4", "--max_steps", "2", "--prompts_per_update", "4",
            "--num_generations", "2", "--max_completion_length", "24", "--generation_batch_size", "16",
            "--critic_warmup_updates", "0", "--save_steps", "1", "--report_to", "none", "--num_threads", "1",
            "--disable_tqdm", "true", "--output_dir", str(out)]
    launch(["--config_file", str(ACCEL / "zero2.yaml"), "--num_processes", "2"], {}, args)
    result = json.loads((out / "eval.json").read_text())
    assert result["processes"] == 2 and result["reward_shaping"] == "delta" and result["advantage_estimator"] == "gae"
    assert (out / "policy" / "adapter_config.json").exists() and (out / "critic").exists()


def _rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the worker with LOCAL_RANK `rank` among the launcher's descendants."""
    import psutil

    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if child.environ().get("LOCAL_RANK") == str(rank) and "ppo_step.py" in " ".join(child.cmdline()):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@needs_deepspeed
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_killed_rank_stops_the_other_and_the_run_resumes_to_the_same_policy(models, tmp_path, float32_runs,
                                                                              launcher):
    from safetensors.torch import load_file

    out = tmp_path / "killed"
    args = ppo_args(models, out)  # the float32 run's arguments: its policy is the uninterrupted one
    proc = subprocess.Popen(launch_cmd(float32(launcher), args), env=env_for(LAUNCHERS[launcher][1]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.time() + 300
    while not (out / "checkpoint-1").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None, "the run ended before a rank could be killed"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        pytest.fail("the surviving rank did not stop within 60 s of its peer's death")
    assert time.time() - killed_at < 60
    assert proc.returncode != 0 and not (out / "eval.json").exists()
    # one line names the lost rank and how it ended
    assert any("local_rank: 1" in line and "exitcode: -9" in line for line in stderr.splitlines()), stderr[-3000:]
    done = launch(float32(launcher), LAUNCHERS[launcher][1], [*args, "--resume_from_checkpoint", "auto"],
                  retry_crash=False)  # a fresh folder would not be a resume
    assert "resuming from" in done.stderr
    resumed = load_file(str(out / "policy" / "model.safetensors"))
    whole = load_file(str(float32_runs[launcher] / "policy" / "model.safetensors"))
    assert all(torch.equal(resumed[k], whole[k]) for k in whole), launcher


def _fraction_changed(start: dict, end: dict) -> float:
    changed = sum((end[k].float() != start[k].float()).sum().item() for k in start)
    return changed / sum(v.numel() for v in start.values())


def test_bf16_is_mixed_precision_whose_updates_move_the_weights_as_float32_ones_do(models, tmp_path):
    """10 updates at lr 1e-6, one process, from the command line: with bf16 weights stepped by
    AdamW (the earlier loading) about 2% of the weights moved, against all of them in float32;
    as mixed precision (float32 master weights, bf16 autocast) bf16 moves them as float32 does."""
    from safetensors.torch import load_file

    from rl import ppo_step

    start = load_file(str(models / "policy" / "model.safetensors"))
    share = {}
    for precision in ("float32", "bf16"):
        out = tmp_path / precision
        args = ppo_args(models, out, "--reward", "gold", "--advantage_estimator", "group", "--max_steps", "10",
                        "--learning_rate", "1e-6", "--save_steps", "0", "--eval_dataset", "none", "--n_probe", "0",
                        "--num_mini_batches", "1")
        if precision == "bf16":
            args += ["--bf16", "true"]
        assert ppo_step.main(args) == 0
        end = load_file(str(out / "policy" / "model.safetensors"))
        assert all(v.dtype == torch.float32 for v in end.values())
        share[precision] = _fraction_changed(start, end)
    print(f"weights changed after 10 updates: float32 {share['float32']:.4f}, bf16 {share['bf16']:.4f}")
    assert share["float32"] > 0.9
    assert share["bf16"] >= share["float32"] - 0.02


class _Plugin:
    def __init__(self, config, stage):
        self.deepspeed_config = config
        self.zero_stage = stage


class _Accelerator:
    """What `configure_deepspeed` reads of an Accelerator."""

    def __init__(self, config, stage=2, processes=2):
        self.state = type("State", (), {"deepspeed_plugin": _Plugin(config, stage)})()
        self.num_processes = processes


def test_deepspeed_takes_its_batch_and_clipping_from_the_ppo_settings():
    from rl.distributed import configure_deepspeed

    config = {"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}
    said = configure_deepspeed(_Accelerator(config), micro_batch=8, max_grad_norm=0.5, hidden_size=32)
    assert config["train_micro_batch_size_per_gpu"] == 8 and config["gradient_accumulation_steps"] == 1
    assert config["train_batch_size"] == 16 and config["gradient_clipping"] == 0.5
    assert "stage3_param_persistence_threshold" not in config["zero_optimization"]
    assert any("--max_grad_norm" in s for s in said)
    # a number the DeepSpeed config sets itself stays, and the log says which clipping applies
    config = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 7}, "gradient_clipping": 2.0}
    said = configure_deepspeed(_Accelerator(config, stage=3), micro_batch=4, max_grad_norm=1.0, hidden_size=32)
    assert config["gradient_clipping"] == 2.0 and any("not --max_grad_norm 1.0" in s for s in said)
    zero = config["zero_optimization"]
    assert zero["stage3_param_persistence_threshold"] == 7  # the user's, kept
    assert zero["reduce_bucket_size"] == 32 * 32 and zero["stage3_prefetch_bucket_size"] == int(0.9 * 32 * 32)


def test_under_deepspeed_the_schedule_counts_the_engines_own_steps():
    from rl.ppo_config import StepPPOConfig
    from rl.ppo_prepare import scheduler_steps

    args = StepPPOConfig(output_dir="/tmp/x", max_steps=10, num_iterations=2, num_mini_batches=4, report_to="none")
    assert scheduler_steps(args, 2) == 10 * 2 * 4 * 2  # accelerate's scheduler steps once per process
    assert scheduler_steps(args, 2, deepspeed=True) == 10 * 2 * 4  # the engine steps it once per optimizer step


def test_bf16_parses_on_a_machine_without_a_gpu_and_keeps_float32_weights():
    from rl.ppo_cli import parse_config
    from rl.ppo_setup import _dtype

    args = parse_config(["--bf16", "true", "--output_dir", "/tmp/x"])
    assert args.bf16 and not args.use_cpu  # use_cpu would turn DeepSpeed off
    assert _dtype(args) == torch.float32


def test_launches_that_cannot_work_stop_before_any_model_loads(models, tmp_path, capsys, monkeypatch):
    import importlib.util

    from rl import ppo_step

    base = ["--model_name_or_path", str(models / "policy"), "--build_missing", "false", "--output_dir",
            str(tmp_path / "run"), "--use_vllm", "true"]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name,
                        *a: None if name == "vllm" else real_find_spec(name, *a))
    assert ppo_step.main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--use_vllm true needs vLLM" in err[0]
    # with vLLM installed but no GPU: the CPU build needs heads of 32 or more; this policy's are 16
    monkeypatch.setattr(importlib.util, "find_spec", lambda name,
                        *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr("rl.ppo_setup.has_gpu", lambda: False)
    assert ppo_step.main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attention head dimension of at least 32" in err[0] and "has 16" in err[0]
    assert not (tmp_path / "run").exists()


def test_fsdp_configs_the_trainer_does_not_run_stop_in_one_line(models, tmp_path, capsys, monkeypatch):
    """FSDP1 and parameter offload are refused in one line, exit 2, before any model loads (the
    environment is what `accelerate launch` sets from a config). vLLM under FSDP2 runs:
    tests/test_vllm_cpu.py."""
    from rl import fsdp2, ppo_step

    monkeypatch.setattr(fsdp2, "_SETTINGS", None)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)  # restored after: the FSDP2 path may set it
    base = ["--model_name_or_path", str(models / "policy"), "--build_missing", "false", "--output_dir",
            str(tmp_path / "run"), "--reward", "gold", "--advantage_estimator", "group"]
    cases = [({"FSDP_VERSION": "1"}, base, "FSDP version 1: the trainer runs FSDP2 only"),
             ({"FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}, base, "fsdp_offload_params: true")]
    for env, argv, said in cases:
        monkeypatch.setattr(fsdp2, "_SETTINGS", None)
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert ppo_step.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "run").exists()
