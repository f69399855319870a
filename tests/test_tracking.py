"""`report_to` on the PPO trainer: the Accelerator gets a logging directory, the tracker gets the
project (`--project`, `WANDB_PROJECT`) and the run name."""

import importlib.util
import json

import pytest

from rl import tracking
from rl.ppo_config import StepPPOConfig


def test_project_run_name_and_logging_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), report_to="none")
    assert tracking.project_name(args) == "steprl-ppo"
    assert tracking.logging_dir(args) == str(tmp_path / "run" / "runs")
    assert tracking.init_kwargs(args) == {}
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert tracking.project_name(args) == "from-env"
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), report_to="none", project="from-config",
                         run_name="seed1", logging_dir=str(tmp_path / "logs"))
    assert tracking.project_name(args) == "from-config"
    assert tracking.logging_dir(args) == str(tmp_path / "logs")
    assert tracking.init_kwargs(args)["wandb"] == {"name": "seed1"}
    assert tracking.init_kwargs(args)["trackio"] == {"name": "seed1"}


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard not installed (pip install 'steprl[tracking]')")
def test_ppo_trainer_logs_to_tensorboard(tmp_path, monkeypatch):
    """`--report_to tensorboard` used to stop at start: "Logging with `tensorboard` requires a `logging_dir`"."""
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate
    from rl.models import build_tiny_causal_lm
    from rl.ppo_setup import load_critic, load_policy, load_problems
    from rl.ppo_trainer import StepPPOTrainer

    world = WorldConfig(min_steps=1, max_steps=2)
    rows = generate("train", 50, 0, world)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    policy_dir = tmp_path / "policy"
    build_tiny_causal_lm(tok, hidden_size=16, num_layers=1, num_heads=2, seed=0).save_pretrained(policy_dir)
    tok.save_pretrained(policy_dir)
    (policy_dir / "world_config.json").write_text(json.dumps(world.__dict__))

    monkeypatch.setenv("WANDB_PROJECT", "tb-project")
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), policy=str(policy_dir), verifier="exact",
                         critic_init="policy", build_missing=False, n_prompts=4, n_eval=2, report_to="tensorboard",
                         run_name="seed0", disable_tqdm=True)
    train, _ = load_problems("world", args.n_prompts, args, "train")
    policy, tok = load_policy(args)
    trainer = StepPPOTrainer(args, policy, tok, load_critic(args, tok), None, train, [])
    tracking.init_trackers(trainer.accelerator, args)
    trainer.accelerator.log({"reward/mean_total": 0.5}, step=1)
    trainer.accelerator.end_training()
    events = list((tmp_path / "run" / "runs" / "tb-project").glob("events.out.tfevents.*"))
    assert events, sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*"))
