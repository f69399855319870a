r"""All the PPO update math, in one file: advantages, returns, losses, KL. Pure torch, no plumbing.

Shapes: every per-token tensor is ``[B, T]`` over the *response* tokens of ``B`` sequences, with
``mask`` 1 for real response tokens and 0 for the padding after EOS (float or bool). Padding is
on the right: an episode ends at its last masked token. Masked means and variances are global
over the real tokens of the whole batch (token-level averaging, as in TRL / CleanRL).

Notation: ``π`` the policy being updated, ``π_old`` the policy that generated the rollouts,
``π_ref`` the frozen reference, ``logp = log π(a_t|s_t)`` per token.

KL estimators (Schulman, "Approximating KL divergence"), with ``r = π_ref / π = exp(logp_ref − logp)``,
all estimating KL(π ‖ π_ref) from samples of π::

    k1 = logp − logp_ref                 unbiased, can be negative, high variance
    k2 = ½ (logp − logp_ref)²            biased, always ≥ 0, low variance
    k3 = (r − 1) − log r                 unbiased, always ≥ 0, low variance

Generalized advantage estimation (Schulman et al. 2016), backward over time, with
``V_{t+1} = 0`` after the last real token (the episode ends there, no bootstrap)::

    δ_t = r_t + γ V_{t+1} − V_t
    A_t = δ_t + γ λ A_{t+1}             (A_T = 0)
    R_t = A_t + V_t                     (the critic's regression target)

Discounted return-to-go (critic-free baselines)::

    G_t = r_t + γ G_{t+1}

RLOO baseline (Kool et al. 2019; Ahmadian et al. 2024) for sample ``i`` of a group of ``k`` samples
of the same prompt::

    b_i = (Σ_{j≠i} s_j) / (k − 1)

Group-normalised step advantages (DeepSeekMath's process supervision for GRPO, Shao et al. 2024):
the rewards of every step of every sample of one prompt form a set ``R``; each is normalised over
it, and a token's advantage is the sum of the normalised rewards of the steps ending at or after
it. An outcome reward is one reward at the last token, which makes this GRPO's outcome baseline::

    r̃_s = (r_s − mean(R)) / (std(R) + ε)
    A_t = Σ_{s : end(s) ≥ t} r̃_s

Monte Carlo step values (VinePPO, Kazemnejad et al. 2024), critic-free: a response of steps
``1..n`` passes the states ``s_0`` (the prompt), ``s_1`` (the prompt and step 1), ..., ``s_n`` (the
whole response). ``V(s_j)`` for ``0 < j < n`` is the mean reward of ``K`` continuations sampled
from ``s_j``; ``V(s_n) = R``, the response's own reward; ``V(s_0)`` a baseline of the prompt. Every
token of step ``j`` (tokens after the last step end belong to the last step) gets the change in
value across its step::

    A_t = V(s_j) − V(s_{j−1})            for t in step j

PPO clipped surrogate (Schulman et al. 2017), ``ρ_t = exp(logp − logp_old)``, minimised::

    L_pg = mean_t max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε, 1 + ε))

Clipped value loss, ``c`` the value clip range::

    V^clip_t = V_old,t + clip(V_t − V_old,t, −c, c)
    L_vf = ½ mean_t max((V_t − R_t)², (V^clip_t − R_t)²)

Adaptive KL coefficient (Ziegler et al. 2019), a proportional controller towards a target KL::

    e = clip(KL / KL_target − 1, −0.2, 0.2)
    β ← β (1 + e · n_steps / horizon)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "ESTIMATORS",
    "AdaptiveKLController",
    "AdvantageBatch",
    "Advantages",
    "Estimator",
    "FixedKLController",
    "discounted_returns",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "group_step_advantages",
    "is_finite_batch",
    "leave_one_out_baseline",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "per_token_kl",
    "policy_loss",
    "register_estimator",
    "step_value_advantages",
    "token_steps_from_ends",
    "value_loss",
]

KL_KINDS = ("k1", "k2", "k3")


# ---------------------------------------------------------------------------------------------
# Masked statistics
# ---------------------------------------------------------------------------------------------


def _as_float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} but the values have shape {tuple(like.shape)}")
    return mask.to(like.dtype if like.is_floating_point() else torch.float32)


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x at real tokens, 0 elsewhere (a NaN or inf in the padding does not leak into sums)."""
    return torch.where(mask != 0, x, torch.zeros_like(x)) * mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over the entries where `mask` is set (over all of them, or along `dim`).

    An all-padding row (or batch) has mean 0 rather than NaN.
    """
    mask = _as_float_mask(mask, x)
    total = _masked(x, mask).sum() if dim is None else _masked(x, mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1e-8)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries of `x` (global); `unbiased` applies Bessel's n / (n − 1)."""
    mask = _as_float_mask(mask, x)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n.item() <= 1:
            raise ValueError(f"the unbiased variance needs at least 2 masked entries, got {n.item():g}")
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) / std over the masked entries; with `shift_mean=False` the mean is kept.

    The statistics are global over every masked entry of the batch; padded entries come out 0.
    """
    mask = _as_float_mask(mask, x)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return _masked(whitened, mask)


# ---------------------------------------------------------------------------------------------
# Per-token quantities from logits
# ---------------------------------------------------------------------------------------------


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position: [B, T, V] logits and [B, T] labels -> [B, T] float32.

    Computed in float32 as logit[label] − logsumexp(logits), whatever the input dtype; a bf16 or
    fp16 input is upcast one sequence at a time, so memory grows by one [T, V] float32 slice only.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    labels = labels.long().unsqueeze(-1)
    if logits.dtype == torch.float32 or logits.dtype == torch.float64:
        picked = logits.gather(-1, labels).squeeze(-1)
        return (picked - torch.logsumexp(logits, dim=-1)).float()
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logits = row_logits.float()
        picked = row_logits.gather(-1, row_labels).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: [B, T, V] -> [B, T] float32.

    H = logsumexp(z) − Σ_v softmax(z)_v z_v (stable: no log of a probability).
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def per_token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens' log-probs: [B, T] -> [B, T].

    kind "k1": logp − logp_ref; "k2": ½ (logp − logp_ref)²; "k3": (r − 1) − log r with
    r = exp(logp_ref − logp). For k3 the log-ratio is clamped to ±20 so exp cannot overflow.
    """
    log_ratio = logprobs - ref_logprobs  # log π / π_ref
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        log_r = (-log_ratio).clamp(-20.0, 20.0)  # log r = log π_ref / π
        return (torch.exp(log_r) - 1) - log_r
    raise ValueError(f"kind must be one of {', '.join(KL_KINDS)}; got {kind!r}")


# ---------------------------------------------------------------------------------------------
# Advantages and returns
# ---------------------------------------------------------------------------------------------


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over [B, T] response tokens -> (advantages, returns).

    The recursion runs backward over time. Values (and rewards) at padded positions count as 0,
    so V_{t+1} = 0 after the last real token: the episode ends there, nothing is bootstrapped.
    Both outputs are 0 at padded positions. (Padding belongs on the right; a 0 inside a row would
    cut the episode there.)
    """
    mask = _as_float_mask(mask, values)
    rewards = _masked(rewards.to(values.dtype), mask)
    values = _masked(values, mask)
    batch, steps = values.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)  # V_{t+1}
    next_advantage = torch.zeros(batch, dtype=values.dtype, device=values.device)  # A_{t+1}
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # δ_t = r_t + γ V_{t+1} − V_t
        advantage = delta + gamma * lam * next_advantage  # A_t = δ_t + γ λ A_{t+1}
        advantage = advantage * mask[:, t]  # padding: no advantage, and nothing flows back from it
        advantages[:, t] = advantage
        next_value, next_advantage = values[:, t], advantage
    returns = (advantages + values) * mask  # R_t = A_t + V_t
    return advantages, returns


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R) over the masked tokens: 1 for a perfect critic, 0 for one that predicts
    the mean, negative for one worse than that (0 when the returns do not vary)."""
    mask = _as_float_mask(mask, returns)
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    if var_returns.item() <= 1e-12:
        return 0.0
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return float(1.0 - var_residual / var_returns)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go per token, G_t = r_t + γ G_{t+1}, over [B, T]; 0 at padded positions."""
    mask = _as_float_mask(mask, rewards)
    rewards = _masked(rewards, mask)
    returns = torch.zeros_like(rewards)
    next_return = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)  # G_{t+1}
    for t in reversed(range(rewards.shape[1])):
        next_return = (rewards[:, t] + gamma * next_return) * mask[:, t]  # G_t
        returns[:, t] = next_return
    return returns


def leave_one_out_baseline(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO baseline: for each score, the mean of the *other* scores of its group.

    `scores` is [N] with N = prompts × group_size, the samples of one prompt contiguous:
    [p0s0, p0s1, ..., p1s0, ...]. Returns [N].
    """
    scores = torch.as_tensor(scores)
    if not scores.is_floating_point():
        scores = scores.float()
    if group_size < 2:
        raise ValueError(f"a leave-one-out baseline needs group_size >= 2, got {group_size}")
    if scores.dim() != 1 or scores.numel() % group_size != 0:
        raise ValueError(
            f"scores must be 1-D with a length divisible by group_size={group_size}; got shape {tuple(scores.shape)}"
        )
    groups = scores.view(-1, group_size)
    others = groups.sum(dim=1, keepdim=True) - groups  # Σ_{j≠i} s_j
    return (others / (group_size - 1)).reshape(-1)


STEP_CREDITS = ("return", "own")
REWARD_SCALES = ("group", "batch", "none")
"""How group advantages are scaled after the group mean is taken off (TRL's `scale_rewards`)."""


def group_step_advantages(
    rewards: torch.Tensor, reward_mask: torch.Tensor, mask: torch.Tensor, group_size: int, eps: float = 1e-6,
    credit: str = "return", scale: str = "group",
) -> tuple[torch.Tensor, dict]:
    """Critic-free step-level advantages over [B, T] response tokens (DeepSeekMath's process supervision).

    `rewards` holds each step's reward on the token that ends the step, `reward_mask` marks those
    tokens (a sample with an outcome reward only has one mark, on its last token), and the B rows
    are groups of `group_size` samples of one prompt, contiguous. Every marked reward is normalised
    by the mean and standard deviation (population) of the marked rewards of its group; a token's
    advantage is the sum of the normalised rewards marked at or after it (`credit="return"`), or
    (`credit="own"`) the normalised reward of the step it belongs to alone, the first marked at or
    after it (tokens after the last mark get 0): for a verifier that judges each step on its own,
    a step is then neither blamed for later steps nor paid for them. With one reward per sample
    (an outcome) the two are the same. A group whose rewards are all equal (or that has a single
    reward) has advantage 0 everywhere: it carries no signal.

    `scale` (TRL's `scale_rewards`): "group" divides by the group's standard deviation, as above;
    "batch" by the standard deviation (population) of every marked reward of the batch, so that a
    group whose rewards differ little (a verifier's scores among samples the answer check all
    failed) gets small advantages rather than ones as large as a right-against-wrong group's, and a
    reward's weight then sets its share of the update; "none" only takes off the group mean
    (Dr. GRPO). Under "group" the advantages do not change when every reward is scaled by one
    factor, so a weight on a reward that alone varies in a group does nothing there.

    Returns (advantages [B, T], 0 at padding; stats with `flat_groups`, the fraction of groups
    whose marked rewards were all equal, and `flat_rows`, a [B] bool tensor marking the rows of
    those groups, which DAPO leaves out of the batch: they carry no signal, and inside a token mean
    they only dilute it).
    """
    _check_group_inputs(rewards, reward_mask, mask, group_size, credit, scale)
    mask = _as_float_mask(mask, rewards.float())
    marked = (reward_mask != 0) & (mask != 0)
    rewards = torch.where(marked, rewards.float(), torch.zeros_like(rewards, dtype=torch.float32))
    b, t = rewards.shape
    g = rewards.view(-1, group_size * t)
    m = marked.view(-1, group_size * t).float()
    count = m.sum(-1, keepdim=True)
    mean = (g * m).sum(-1, keepdim=True) / count.clamp(min=1)
    var = (((g - mean) ** 2) * m).sum(-1, keepdim=True) / count.clamp(min=1)
    std = var.sqrt()
    flat = (std.squeeze(-1) <= eps)
    if scale == "group":
        divisor = std + eps
    elif scale == "batch":
        every = rewards[marked]
        divisor = (every.std(unbiased=False) if every.numel() else torch.zeros(())) + eps
    else:
        divisor = torch.ones_like(std)
    normalised = torch.where(flat[:, None], torch.zeros_like(g), (g - mean) / divisor) * m
    advantages = _credited(normalised.view(b, t), marked, mask, credit)
    return advantages, {"flat_groups": flat.float().mean().item(), "flat_rows": flat.repeat_interleave(group_size)}


def _check_group_inputs(rewards: torch.Tensor, reward_mask: torch.Tensor, mask: torch.Tensor, group_size: int,
                        credit: str, scale: str) -> None:
    if rewards.shape != reward_mask.shape or rewards.shape != mask.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, reward_mask {tuple(reward_mask.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape")
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"the batch of {rewards.shape[0]} rows is not made of groups of {group_size}")
    if credit not in STEP_CREDITS:
        raise ValueError(f"credit must be one of {', '.join(STEP_CREDITS)}; got {credit!r}")
    if scale not in REWARD_SCALES:
        raise ValueError(f"scale must be one of {', '.join(REWARD_SCALES)}; got {scale!r}")


def _credited(normalised: torch.Tensor, marked: torch.Tensor, mask: torch.Tensor, credit: str) -> torch.Tensor:
    """Each token's advantage from the normalised rewards at the marked tokens: the sum of those at or
    after it (`return`), or the first one at or after it, its own step's (`own`); 0 at padding."""
    b, t = normalised.shape
    if credit == "own":
        # A_t = r̃ at the first marked position t' >= t: a reversed cumulative min of marked indices
        positions = torch.arange(t, device=normalised.device).expand(b, t)
        marks = torch.where(marked, positions, torch.full_like(positions, t))
        following = torch.flip(torch.cummin(torch.flip(marks, [1]), 1).values, [1])
        padded = torch.cat([normalised, torch.zeros_like(normalised[:, :1])], 1)
        return padded.gather(1, following) * mask
    # A_t = Σ_{t' >= t} r̃_t': a reversed cumulative sum
    return torch.flip(torch.cumsum(torch.flip(normalised, [1]), 1), [1]) * mask


def token_steps_from_ends(step_ends: list[list[int]], width: int) -> torch.Tensor:
    """The step each response token belongs to, [B, width] long, from the token index where each
    step of each row ends (non-decreasing; `rl.step_rewards.step_end_token_positions`).

    A token belongs to the first step ending at or after it; tokens after the last step end (an
    EOS, untagged text after the last `</Step>`) belong to the last step; a row with no step is
    one step, 0 everywhere. So token t of a row with ends e_0..e_{n-1} is in step
    min(#{j : e_j < t}, n − 1), and the row has max(n, 1) steps.
    """
    positions = torch.arange(width)
    rows = []
    for ends in step_ends:
        if any(b < a for a, b in zip(ends, ends[1:])):
            raise ValueError(f"step ends must be non-decreasing, got {list(ends)}")
        inner = torch.tensor(list(ends[:-1]), dtype=torch.long)  # the last end closes nothing: later tokens join it
        rows.append((inner[None, :] < positions[:, None]).sum(-1) if len(inner)
                    else torch.zeros(width, dtype=torch.long))
    return torch.stack(rows) if rows else torch.zeros((0, width), dtype=torch.long)


def step_value_advantages(step_values: torch.Tensor, token_steps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """VinePPO's advantages over [B, T] response tokens from Monte Carlo values of step boundaries.

    `step_values` is [B, S + 1]: row b's V(s_0), V(s_1), ..., V(s_n) for its n <= S steps (V(s_0)
    the prompt's value, V(s_n) the response's reward; entries past n are padding, never read).
    `token_steps` is [B, T], the step j (0-based) of each token (`token_steps_from_ends`). A token
    of step j gets V(s_{j+1}) − V(s_j); padded tokens get 0 (their `token_steps` are not read).
    """
    if token_steps.shape != mask.shape:
        raise ValueError(f"token_steps {tuple(token_steps.shape)} and mask {tuple(mask.shape)} must have one shape")
    if step_values.dim() != 2 or step_values.shape[0] != token_steps.shape[0] or step_values.shape[1] < 2:
        raise ValueError(f"step_values must be [B, S + 1] with S >= 1 for B = {token_steps.shape[0]} rows; "
                         f"got {tuple(step_values.shape)}")
    values = step_values.float()
    mask = _as_float_mask(mask, values[:, :1].expand_as(token_steps))
    real = mask != 0
    steps = torch.where(real, token_steps.long(), torch.zeros_like(token_steps, dtype=torch.long))
    if bool((steps < 0).any()) or bool((steps + 1 >= values.shape[1]).any()):
        raise ValueError(f"a real token's step is outside the {values.shape[1] - 1} steps step_values covers")
    before = values.gather(1, steps)  # V(s_j)
    after = values.gather(1, steps + 1)  # V(s_{j+1})
    return torch.where(real, after - before, torch.zeros_like(before)) * mask


# ---------------------------------------------------------------------------------------------
# Advantage estimators, by name
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advantages:
    """What an estimator gives the update: per-token advantages and the critic's targets."""

    advantages: torch.Tensor
    """[B, T], 0 at padding."""
    returns: torch.Tensor
    """[B, T]: the value loss's targets (zeros for a critic-free estimator)."""
    values: torch.Tensor
    """[B, T]: the old values the value loss clips around (zeros for a critic-free estimator)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Logged with the update's metrics."""
    flat_rows: torch.Tensor | None = None
    """[B] bool: rows of groups whose rewards were all equal (the group estimator's; DAPO drops them)."""


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator reads of one update's batch: [B, T] tensors, the B rows in groups of
    `num_generations` samples of one prompt, contiguous."""

    rewards: torch.Tensor
    """The placed rewards of every token (less the KL penalty, unless the estimator keeps the KL in the loss)."""
    mask: torch.Tensor
    """1 on response tokens."""
    reward_mask: torch.Tensor | None = None
    """1 where a reward was placed (every credited step end, and the last token when it is paid)."""
    values: torch.Tensor | None = None
    """The critic's values of the sampling policy (`uses_critic` estimators)."""
    step_values: torch.Tensor | None = None
    """[B, S + 1] Monte Carlo values of every response's step boundaries (`monte_carlo` estimators)."""
    token_steps: torch.Tensor | None = None
    """[B, T] the step of each token, as `token_steps_from_ends` gives it (with `step_values`)."""


EstimateFn = Callable[[AdvantageBatch, Any], Advantages]
"""An advantage estimator: `fn(batch, cfg) -> Advantages`, `cfg` the run's settings
(`rl.ppo_config.StepPPOConfig`: it reads the fields it needs, gamma, lam, num_generations, ...)."""


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator and what the update does around it: its capability flags, which the
    trainer and the settings' checks (`rl.ppo_config`) read here and nowhere else."""

    estimate: EstimateFn
    uses_critic: bool = False
    """Values in every forward, a critic trained and warmed up; False: no critic is kept at all."""
    groups: bool = False
    """Needs the samples of a prompt together (num_generations >= 2)."""
    kl_in_loss: bool = False
    """The KL penalty is a loss term (GRPO's placement), not subtracted from the rewards."""
    normalised: bool = False
    """Its advantages are normalised already (never whitened again)."""
    drops_flat_groups: bool = False
    """Reports `flat_rows`, so that flat groups can be left out of the loss."""
    scales_rewards: bool = False
    """Reads `scale_rewards` (`--scale_rewards`): it centres rewards within groups and scales them."""
    monte_carlo: bool = False
    """Reads `step_values`: Monte Carlo values of step boundaries, answer-check means of continuations
    that the trainer samples first (`rl.rollouts`); the config then checks what such values allow
    (the gold reward, gamma 1, ...)."""


ESTIMATORS: dict[str, Estimator] = {}
"""Each `--advantage_estimator` by name, in the order registered (`register_estimator`, beside each
estimator's code below): the one place a name is resolved. gae: GAE over a critic's values; rloo:
the return-to-go against the leave-one-out mean of its group's returns; group: the group-normalised
step advantages (DeepSeekMath; GRPO with an outcome reward); mc_values: VinePPO's advantages from
Monte Carlo values of step boundaries."""


def register_estimator(name: str, **flags: bool) -> Callable[[EstimateFn], EstimateFn]:
    """Registers `fn(batch, cfg) -> Advantages` as the estimator `name` with its capability flags
    (`Estimator`'s fields): a new estimator is one registered function, a new knob one config field
    that its function reads."""
    def register(fn: EstimateFn) -> EstimateFn:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = Estimator(fn, **flags)
        return fn

    return register


@register_estimator("gae", uses_critic=True)
def gae_estimate(batch: AdvantageBatch, cfg: Any) -> Advantages:
    """GAE (cfg.gamma, cfg.lam) over the critic's values."""
    if batch.values is None:
        raise ValueError("the gae estimator needs the critic's values")
    advantages, returns = gae(batch.rewards, batch.values * batch.mask, batch.mask, cfg.gamma, cfg.lam)
    stats = {"value/explained_variance": explained_variance(batch.values, returns, batch.mask)}
    return Advantages(advantages, returns, batch.values, stats)


@register_estimator("rloo", groups=True)
def rloo_estimate(batch: AdvantageBatch, cfg: Any) -> Advantages:
    """The return-to-go (cfg.gamma) against the leave-one-out mean of its group's returns."""
    togo = discounted_returns(batch.rewards, batch.mask, cfg.gamma)
    baseline = leave_one_out_baseline(togo[:, 0], cfg.num_generations)
    return Advantages((togo - baseline[:, None]) * batch.mask, togo, torch.zeros_like(togo))


@register_estimator("group", groups=True, kl_in_loss=True, normalised=True, drops_flat_groups=True,
                    scales_rewards=True)
def group_estimate(batch: AdvantageBatch, cfg: Any) -> Advantages:
    """Group-normalised step rewards (cfg.step_credit, cfg.scale_rewards): `group_step_advantages`."""
    if batch.reward_mask is None:
        raise ValueError("the group estimator needs the reward mask (where each reward was placed)")
    advantages, group_stats = group_step_advantages(batch.rewards, batch.reward_mask, batch.mask, cfg.num_generations,
                                                    credit=cfg.step_credit, scale=cfg.scale_rewards)
    zeros = torch.zeros_like(advantages)
    return Advantages(advantages, zeros, zeros, {"rollout/flat_reward_groups": group_stats["flat_groups"]},
                      flat_rows=group_stats["flat_rows"])


# the KL is a loss term: advantages that are differences of Monte Carlo values have no per-token
# reward for a penalty to enter
@register_estimator("mc_values", groups=True, kl_in_loss=True, monte_carlo=True)
def mc_values_estimate(batch: AdvantageBatch, cfg: Any) -> Advantages:
    """VinePPO: each token gets the change in Monte Carlo value across its step (`step_value_advantages`)."""
    if batch.step_values is None or batch.token_steps is None:
        raise ValueError("the mc_values estimator needs the Monte Carlo values of step boundaries")
    advantages = step_value_advantages(batch.step_values, batch.token_steps, batch.mask.cpu()).to(batch.mask.device)
    zeros = torch.zeros_like(advantages)
    return Advantages(advantages, zeros, zeros)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (to minimise), a masked mean over tokens, and its statistics.

    stats (detached 0-dim tensors): `clipfrac`, the fraction of tokens where the clipped term is
    the one taken; `approx_kl`, mean ½ (logp − logp_old)²; `ratio_mean`, mean ρ.
    """
    mask = _as_float_mask(mask, logprobs)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)  # ρ_t
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = masked_mean(torch.max(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "approx_kl": masked_mean(0.5 * log_ratio**2, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_range_value: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ½ max((V − R)², (V_clip − R)²), a masked mean; None turns clipping off.

    stats (detached 0-dim tensor): `vf_clipfrac`, the fraction of tokens where the clipped error
    is the larger one.
    """
    mask = _as_float_mask(mask, values)
    unclipped_error = (values - returns) ** 2
    if clip_range_value is None:
        loss = 0.5 * masked_mean(unclipped_error, mask)
        return loss, {"vf_clipfrac": torch.zeros((), device=values.device)}
    values_clipped = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
    clipped_error = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_error, clipped_error), mask)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((clipped_error > unclipped_error).float(), mask)}
    return loss, stats


# ---------------------------------------------------------------------------------------------
# KL coefficient controllers
# ---------------------------------------------------------------------------------------------


class AdaptiveKLController:
    """Ziegler et al. (2019): move the KL coefficient so the measured KL approaches `target`.

    e = clip(KL / target − 1, −0.2, 0.2); β ← β (1 + e · n_steps / horizon).
    """

    def __init__(self, init_beta: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got target={target}, horizon={horizon}")
        self.value = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class FixedKLController:
    """A constant KL coefficient, with the same interface as `AdaptiveKLController`."""

    def __init__(self, beta: float):
        self.value = float(beta)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def is_finite_batch(*tensors: torch.Tensor | float | None) -> bool:
    """True when every given tensor (or number) is free of NaN and inf; None arguments are skipped."""
    for t in tensors:
        if t is None:
            continue
        if not bool(torch.isfinite(torch.as_tensor(t)).all()):
            return False
    return True
