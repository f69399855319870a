"""The typed batches one PPO update passes between its phases (`rl/ppo_trainer.py`): the sampled
`Rollouts` (`rl/rollouts.py`), their `LogProbs` under the policy and the reference, the Monte Carlo
`StepValues` of their step boundaries (mc_values) and the `Advantages` the optimisation reads.

A leaf module: the sampling, the reward placement and the trainer all import it, and it imports
none of them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasoning.types import Problem


@dataclass
class Rollouts:
    """One update's batch on this process; tensors are [N, ...] with N = prompts * samples."""

    query_ids: torch.Tensor  # [N, P] left-padded
    query_mask: torch.Tensor
    response_ids: torch.Tensor  # [N, R] right-padded with pad
    response_mask: torch.Tensor  # 1 on response tokens (EOS included)
    texts: list[str]
    problems: list[Problem]
    reward_mask: torch.Tensor | None = None  # [N, R] 1 where `rewards` placed a reward (set by `rewards`)


@dataclass
class LogProbs:
    """The rollout under the policy as it sampled it (`old`) and under the reference (`ref`): [N, R]
    log-probabilities, the critic's values (None without a critic) and the per-token KL."""

    old: torch.Tensor
    ref: torch.Tensor
    values: torch.Tensor | None
    kl: torch.Tensor


@dataclass
class StepValues:
    """VinePPO's Monte Carlo values of a batch's step boundaries (`rl.rollouts.RolloutSampler.mc_step_values`):
    `values` [N, S + 1] (V(s_0) .. V(s_n) of each response), the step of each response token [N, R]
    (`ppo_math.token_steps_from_ends`), and statistics of the sampling."""

    values: torch.Tensor
    token_steps: torch.Tensor
    stats: dict[str, float]


@dataclass
class Advantages:
    """An estimator's output as the update uses it: advantages and returns [N, R], the values the
    value loss clips around, the tokens the loss averages over, the rewards they came from."""

    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor | None
    loss_mask: torch.Tensor
    token_rewards: torch.Tensor
    stats: dict[str, float]
