"""A tiny world policy saved to a directory, and a PPO trainer over it with the `exact` verifier:
for tests of the trainer's plumbing (trackers, rollout backends) that need no trained model."""

import json
from pathlib import Path


def save_tiny_world_policy(directory: Path) -> Path:
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import WorldConfig, generate
    from rl.models import build_tiny_causal_lm

    world = WorldConfig(min_steps=1, max_steps=2)
    rows = generate("train", 50, 0, world)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    build_tiny_causal_lm(tok, hidden_size=16, num_layers=1, num_heads=2, seed=0).save_pretrained(directory)
    tok.save_pretrained(directory)
    (Path(directory) / "world_config.json").write_text(json.dumps(world.__dict__))
    return Path(directory)


def make_ppo_trainer(tmp_path: Path, **fields):
    """A `StepPPOTrainer` on a fresh tiny policy (critic from the policy, no verifier)."""
    from rl.ppo_config import StepPPOConfig
    from rl.ppo_setup import load_critic, load_policy, load_problems
    from rl.ppo_trainer import StepPPOTrainer

    policy_dir = save_tiny_world_policy(tmp_path / "policy")
    settings = dict(output_dir=str(tmp_path / "run"), model_name_or_path=str(policy_dir), verifier="exact",
                    critic_init="policy", build_missing=False, n_prompts=4, n_eval=2, report_to="none",
                    disable_tqdm=True)
    settings.update(fields)
    args = StepPPOConfig(**settings)
    train, _ = load_problems("world", args.n_prompts, args, "train")
    policy, tok = load_policy(args)
    return StepPPOTrainer(args, policy, tok, load_critic(args, tok), None, train, []), args
