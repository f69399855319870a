"""Rules on `StepPPOConfig`'s settings that take more than a line (`StepPPOConfig.validate` runs them):
what --advantage_estimator mc_values and --verifier_online_update need."""

from __future__ import annotations

from reward_models.load import spec_parts, split_spec
from rl.rewards import REWARDS, check_no_added_rewards


def check_mc_values(config) -> None:
    """Settings that --advantage_estimator mc_values cannot use (its values are mean answer-check
    rewards of sampled continuations, graded as the gold reward grades a response)."""
    if config.mc_rollouts < 1:
        raise ValueError(f"--mc_rollouts must be >= 1, got {config.mc_rollouts}")
    if REWARDS[config.reward].verifier or not REWARDS[config.reward].gold:  # the answer check alone
        raise ValueError("--advantage_estimator mc_values grades its continuations with the answer check: it "
                         f"needs --reward gold, got {config.reward!r}")
    check_no_added_rewards(config.advantage_estimator, len(config.reward_funcs or []), "--reward_funcs")
    if config.gamma != 1:
        raise ValueError("--advantage_estimator mc_values estimates undiscounted values (--gamma 1), got "
                         f"--gamma {config.gamma}")
    if config.reward_normalize:
        raise ValueError("--reward_normalize does not apply to --advantage_estimator mc_values (its values are "
                         "mean rewards of continuations; --whiten_advantages scales the advantages)")
    if config.use_vllm:
        raise ValueError("--advantage_estimator mc_values samples its continuations with --use_vllm false only, "
                         "got --use_vllm true")


def check_online_update(config) -> None:
    """ValueError unless --verifier_online_update has an implicit PRM to train (an `implicit:` verifier,
    alone or a part of a combination, read by a verifier reward)."""
    if not config.verifier_online_update:
        return

    implicit = any(split_spec(p)[0] == "implicit" for p in spec_parts(config.verifier))
    if not REWARDS[config.reward].verifier or not implicit:
        raise ValueError(f"--verifier_online_update trains an implicit PRM: it needs --verifier implicit:PATH and a "
                         f"verifier reward; got --verifier {config.verifier} --reward {config.reward}")
    if config.verifier_online_steps < 1:
        raise ValueError(f"--verifier_online_steps must be >= 1, got {config.verifier_online_steps}")
    if not config.verifier_online_learning_rate > 0:
        raise ValueError(f"--verifier_online_learning_rate must be > 0, got {config.verifier_online_learning_rate}")
