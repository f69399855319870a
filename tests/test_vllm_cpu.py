"""vLLM rollouts for real, on this CPU: the `vllm-cpu` build of vLLM 0.31 (the [vllm-cpu] extra).

- The weight sync (`backends.vllm.sync_policy`, vLLM's `reload_weights`) into a live
  colocated engine: after each push, vLLM's greedy token ids equal transformers' greedy token ids of
  the pushed policy, token for token (float32 both sides), for full fine-tuning (a tied head), a
  LoRA adapter merged in, and an untied head; and the push changed what the engine generates.
- `--use_vllm true` PPO, 2 updates, full fine-tuning and LoRA, 1 process and 2 processes (`accelerate
  launch` with configs/accelerate/cpu_2proc.yaml: one colocated engine per process): rollouts come
  from vLLM, the weights are pushed before every rollout (after every update), and after each push
  the engine's greedy output equals transformers' on the policy just pushed.

The engines run in their own processes (`tests/vllm_cpu_run.py`), never inside pytest. The CPU
build's attention needs a head dimension of at least 32: the policy here is a world Llama with
hidden size 64 and 2 heads. About 15 s per engine start and 30-60 s per PPO run on 2 cores.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "vllm_cpu_run.py"
CPU_2PROC = ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_USE_CPU", None)
    env.update(extra)
    return env


def _why_no_vllm() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        import torch
        return (f"vllm is not installed; its CPU build (the [vllm-cpu] extra) requires torch 2.13.0+cpu, this "
                f".venv has torch {torch.__version__}: STEPRL_TORCH=cpu "
                "STEPRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup_env.sh installs both")
    done = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=300,
                          env=_env())
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"vllm is installed but does not import: {last}"
    return None


WHY_NO_VLLM = _why_no_vllm()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NO_VLLM is not None, reason=WHY_NO_VLLM or "")]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A world Llama, hidden 64, 2 heads (head dimension 32), 2 layers, tied head, the world tokenizer."""
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate
    from rl.models import build_tiny_causal_lm

    world = WorldConfig(min_steps=1, max_steps=2)
    directory = tmp_path_factory.mktemp("vllm_cpu") / "policy"
    rows = generate("train", 50, 0, world)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=64, num_layers=2, num_heads=2, seed=0)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    (directory / "world_config.json").write_text(json.dumps(world.__dict__))
    return directory


def _run(cmd: list[str], env: dict[str, str], timeout: int = 600):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    errors = "\n".join(line for line in done.stderr.splitlines() if "Error" in line or "error:" in line)
    assert done.returncode == 0, errors[-3000:] + "\n---\n" + done.stderr[-3000:]
    return done


def test_synced_engine_decodes_greedily_as_transformers_token_for_token(policy_dir, tmp_path):
    out = tmp_path / "sync.json"
    _run([sys.executable, str(HELPER), "sync", str(out), str(policy_dir)], _env())
    results = json.loads(out.read_text())
    assert results["start"]["vllm"] == results["start"]["hf"]  # the staged model, before any push
    for case in ("full", "lora", "untied_full"):
        r = results[case]
        assert r["vllm"] == r["hf"], case  # token for token after the push
        assert r["before"] != r["vllm"], case  # the push changed what the engine generates
    # base names only: 2 layers x 9 + embedding + norm; an untied head adds lm_head.weight
    assert results["full"]["pushed"] == results["lora"]["pushed"] == 20
    assert results["untied_full"]["pushed"] == 21


def _ppo_args(policy_dir: Path, out: Path, *extra: str) -> list[str]:
    """Rollouts from vLLM, a critic (GAE: the answer check pays nothing to an untrained policy, so
    without a value baseline no weight would move), 2 updates."""
    return ["--use_vllm", "true", "--reward", "gold", "--advantage_estimator", "gae", "--critic_warmup_updates", "0",
            "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--build_missing", "false",
            "--max_steps", "2", "--prompts_per_update", "4", "--num_generations", "2", "--n_prompts", "16",
            "--n_eval", "2", "--max_completion_length", "24", "--num_mini_batches", "2", "--num_iterations", "1",
            "--disable_tqdm", "true", "--learning_rate", "1e-2", "--num_threads", "1", "--n_probe", "0",
            "--report_to", "none", *extra]


FSDP2 = ROOT / "configs" / "accelerate" / "fsdp2.yaml"
CASES = {
    # name: (launcher before the helper, environment, processes, extra PPO flags)
    "1proc_full": ([sys.executable], {}, 1, []),
    "1proc_lora": ([sys.executable], {}, 1, ["--use_peft", "true", "--lora_r", "4"]),
    "2proc_full": ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC)],
                   {"ACCELERATE_USE_CPU": "1"}, 2, []),
    # FSDP2 with LoRA: each rank's policy (the peft model's base) is sharded; generation and the push
    # (adapters merged) run on its all-gathered weights. LoRA on 2 processes is this case: the DDP LoRA
    # push is 1proc_lora's, per replica, and replicas agreeing is 2proc_full's check too.
    # FSDP2 with full weights: every pushed tensor is a trained, sharded parameter, read inside
    # rl.fsdp2.whole (all-gathered on every rank); under LoRA the base's shards never change and the
    # update reaches the engine only through the merged adapters.
    "2proc_fsdp2_full": ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP2),
                          "--num_processes", "2", "--mixed_precision", "no"], {}, 2, []),
    "2proc_fsdp2_lora": ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP2),
                          "--num_processes", "2", "--mixed_precision", "no"], {}, 2,
                         ["--use_peft", "true", "--lora_r", "4"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ppo_samples_with_vllm_and_syncs_after_every_update(policy_dir, tmp_path, case):
    launcher, env, processes, extra = CASES[case]
    out, checks = tmp_path / "run", tmp_path / "checks"
    done = _run([*launcher, str(HELPER), "ppo", str(checks), "--", *_ppo_args(policy_dir, out, *extra)], _env(**env))
    if "fsdp2" in case:  # sharded for real, not a silent data-parallel run
        assert all(f"FSDP2 rank {r}: holds" in done.stderr for r in range(2)), done.stderr[-2000:]
    result = json.loads((out / "eval.json").read_text())
    assert result["processes"] == processes and result["updates"] == 2
    assert (out / "vllm_policy" / "model.safetensors").exists()  # the engine started from the staged policy
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["rollout/response_tokens"] > 0 for r in rows)
    for rank in range(processes):
        pushes = [json.loads(line) for line in (checks / f"rank{rank}.jsonl").read_text().splitlines()]
        # one push before each update's rollout: the starting weights, then the weights after update 1
        assert [p["push"] for p in pushes] == [1, 2], (case, rank)
        assert all(p["tensors"] == 20 for p in pushes), (case, rank)  # base names, LoRA merged in
        for p in pushes:
            assert p["equal"], (case, rank, p["push"], p["vllm"], p["hf"])
        assert pushes[1]["fingerprint"] != pushes[0]["fingerprint"], (case, rank)  # the update moved the weights
        assert pushes[1]["vllm"] != pushes[0]["vllm"], (case, rank)  # and the engine decodes the new ones
        assert all(p["torch_threads"] == 1 for p in pushes)  # vLLM's reload leaves --num_threads alone
    if processes == 2:
        first = [json.loads(line) for line in (checks / "rank0.jsonl").read_text().splitlines()]
        second = [json.loads(line) for line in (checks / "rank1.jsonl").read_text().splitlines()]
        assert [p["fingerprint"] for p in first] == [p["fingerprint"] for p in second]  # replicas agree
