"""Policy training: SFT warm-up, step rewards, the PPO trainer."""
