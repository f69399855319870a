"""The baselines trained beside PPO on the same budget: TRL's GRPOTrainer (`grpo_peer`) and
rejection-sampling fine-tuning (`rft`)."""
