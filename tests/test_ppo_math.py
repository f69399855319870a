"""PPO math against numbers worked out by hand (in the comments), plus a brute-force GAE check."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from rl import ppo_math
from rl.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    discounted_returns,
    entropy_from_logits,
    gae,
    is_finite_batch,
    leave_one_out_baseline,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    per_token_kl,
    policy_loss,
    value_loss,
)


def close(actual: torch.Tensor, expected, tol: float = 1e-5) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual.double(), expected, atol=tol, rtol=0), (
        f"{actual.tolist()} != {expected.tolist()}"
    )


# --- masked statistics ----------------------------------------------------------------------------

X = torch.tensor([[1.0, 3.0, 999.0], [5.0, 7.0, -999.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def test_masked_mean_and_var_ignore_padding():
    # masked entries 1, 3, 5, 7: mean 4; squared deviations 9 + 1 + 1 + 9 = 20
    close(masked_mean(X, M), 4.0)
    close(masked_mean(X, M, dim=1), [2.0, 6.0])
    close(masked_var(X, M, unbiased=False), 20 / 4)
    close(masked_var(X, M), 20 / 3)
    close(masked_mean(X, M.bool()), 4.0)  # a bool mask works the same


def test_masked_mean_of_nothing_is_zero_and_nan_padding_does_not_leak():
    close(masked_mean(X, torch.zeros_like(M)), 0.0)
    x = torch.tensor([[2.0, float("nan")], [4.0, float("inf")]])
    close(masked_mean(x, torch.tensor([[1.0, 0.0], [1.0, 0.0]])), 3.0)


def test_masked_var_needs_two_entries():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_whitening_uses_masked_entries_only():
    # std = sqrt(20 / 3) = 2.581989; (1 - 4) / std = -1.161895, (3 - 4) / std = -0.387298
    w = masked_whiten(X, M)
    close(w, [[-1.161895, -0.387298, 0.0], [0.387298, 1.161895, 0.0]])
    # the mean is kept: +4 on the masked entries, padding still 0
    close(masked_whiten(X, M, shift_mean=False), [[2.838105, 3.612702, 0.0], [4.387298, 5.161895, 0.0]])
    with pytest.raises(ValueError, match="shape"):
        masked_whiten(X, M[:, :2])


# --- KL estimators --------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.3]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.3]]))
    ln2 = math.log(2)  # 0.693147
    # k1 = logp - ref: ln 2, -ln 2, 0
    close(per_token_kl(logp, ref, "k1"), [[ln2, -ln2, 0.0]])
    # k2 = ½ (ln 2)² = 0.240227 for both signs
    close(per_token_kl(logp, ref, "k2"), [[0.240227, 0.240227, 0.0]])
    # k3: r = ref/π = 0.5 -> (0.5 - 1) - ln 0.5 = 0.193147;  r = 2 -> (2 - 1) - ln 2 = 0.306853
    close(per_token_kl(logp, ref, "k3"), [[0.193147, 0.306853, 0.0]])
    assert per_token_kl(logp, ref).shape == (1, 3)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        per_token_kl(logp, ref, "k4")


def test_k3_does_not_overflow():
    out = per_token_kl(torch.tensor([[-200.0]]), torch.tensor([[0.0]]), "k3")
    assert torch.isfinite(out).all()


# --- GAE and returns ------------------------------------------------------------------------------


def test_gae_three_token_episode_with_one_padded_position():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])  # the 5 sits in the padding and is ignored
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # so is the 9: V_3 counts as 0
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # γ = 0.9, λ = 0.8, γλ = 0.72
    # t=2: δ = 1 + 0.9*0   - 0.7 = 0.3                      A = 0.3
    # t=1: δ = 0 + 0.9*0.7 - 0.6 = 0.03   A = 0.03 + 0.72*0.3   = 0.246
    # t=0: δ = 0 + 0.9*0.6 - 0.5 = 0.04   A = 0.04 + 0.72*0.246 = 0.21712
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(adv, [[0.21712, 0.246, 0.3, 0.0]])
    # returns = A + V: 0.71712, 0.846, 1.0; 0 at the padding
    close(ret, [[0.71712, 0.846, 1.0, 0.0]])
    adv_bool, _ = gae(rewards, values, mask.bool(), gamma=0.9, lam=0.8)
    close(adv_bool, adv)


def test_gae_with_step_rewards_and_a_full_row():
    # two rows; the second has no padding. γ = 1, λ = 0.5
    rewards = torch.tensor([[0.2, -0.1], [0.0, 1.0]])
    values = torch.tensor([[0.0, 0.0], [0.4, 0.8]])
    mask = torch.ones(2, 2)
    # row 0: t=1 δ = -0.1, A = -0.1;  t=0 δ = 0.2 + 0 - 0 = 0.2, A = 0.2 + 0.5*(-0.1) = 0.15
    # row 1: t=1 δ = 1 - 0.8 = 0.2, A = 0.2;  t=0 δ = 0 + 0.8 - 0.4 = 0.4, A = 0.4 + 0.5*0.2 = 0.5
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    close(adv, [[0.15, -0.1], [0.5, 0.2]])
    close(ret, [[0.15, -0.1], [0.9, 1.0]])


def slow_gae(rewards, values, mask, gamma, lam):
    """One episode at a time, A_t as the explicit sum Σ_l (γλ)^l δ_{t+l} (no recursion)."""
    adv = torch.zeros_like(values, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        length = int(mask[b].sum())  # right padding: the first `length` tokens are real
        r = rewards[b, :length].double().tolist()
        v = values[b, :length].double().tolist() + [0.0]
        deltas = [r[t] + gamma * v[t + 1] - v[t] for t in range(length)]
        for t in range(length):
            adv[b, t] = sum((gamma * lam) ** k * deltas[t + k] for k in range(length - t))
    ret = (adv + values.double()) * mask.double()
    return adv, ret


def test_gae_matches_a_slow_per_episode_loop():
    gen = torch.Generator().manual_seed(0)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8), (0.99, 0.95), (0.5, 0.0)]:
        batch, steps = 6, 9
        lengths = torch.tensor([0, 1, 3, 9, 5, 8])
        mask = (torch.arange(steps)[None, :] < lengths[:, None]).float()
        rewards = torch.randn(batch, steps, generator=gen, dtype=torch.float64)
        values = torch.randn(batch, steps, generator=gen, dtype=torch.float64)
        adv, ret = gae(rewards, values, mask, gamma, lam)
        slow_adv, slow_ret = slow_gae(rewards, values, mask, gamma, lam)
        assert torch.allclose(adv, slow_adv, atol=1e-10)
        assert torch.allclose(ret, slow_ret, atol=1e-10)


def test_discounted_returns_by_hand():
    rewards = torch.tensor([[0.1, 0.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    # γ = 0.9: G2 = 1, G1 = 0.9, G0 = 0.1 + 0.81 = 0.91; the 7 in the padding is ignored
    close(discounted_returns(rewards, mask, 0.9), [[0.91, 0.9, 1.0, 0.0]])


def test_gae_with_lambda_one_and_no_critic_is_the_return_to_go():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]).float()
    adv, _ = gae(rewards, torch.zeros(3, 5), mask, gamma=0.95, lam=1.0)
    close(adv, discounted_returns(rewards, mask, 0.95))


def test_leave_one_out_baseline_by_hand():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    # group 0 = (1, 0, 0): others' means (0+0)/2, (1+0)/2, (1+0)/2
    # group 1 = (1, 1, 0): (1+0)/2, (1+0)/2, (1+1)/2
    close(leave_one_out_baseline(scores, 3), [0.0, 0.5, 0.5, 0.5, 0.5, 1.0])
    close(leave_one_out_baseline([3, 5], 2), [5.0, 3.0])  # a list of ints is fine
    with pytest.raises(ValueError, match="group_size >= 2"):
        leave_one_out_baseline(scores, 1)
    with pytest.raises(ValueError, match="divisible"):
        leave_one_out_baseline(scores, 4)


# --- losses ---------------------------------------------------------------------------------------


def test_policy_loss_with_and_without_clipping():
    clip = 0.2
    # four real tokens in two rows, the padding holds wild (finite) numbers
    # token  ratio  A    -A·ρ    -A·clip(ρ)        max    clipped?
    #   a    1.5   +1   -1.5    -1.2              -1.2   yes
    #   b    1.5   -1   +1.5    +1.2              +1.5   no
    #   c    0.5   -2   +1.0    +1.6 (ρ -> 0.8)   +1.6   yes
    #   d    1.1   +2   -2.2    -2.2              -2.2   no (inside the range)
    # loss = (-1.2 + 1.5 + 1.6 - 2.2) / 4 = -0.075;  clipfrac = 2/4;  ratio_mean = 4.6/4 = 1.15
    ratios = torch.tensor([[1.5, 1.5, 0.5], [1.1, 1.0, 1.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -30.0, 0.0]])
    new = old + torch.log(ratios)
    new[1, 1] = 30.0  # ρ = e^60 in the padding
    adv = torch.tensor([[1.0, -1.0, -2.0], [2.0, -100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    new.requires_grad_(True)
    loss, stats = policy_loss(new, old, adv, mask, clip)
    close(loss.detach(), -0.075)
    close(stats["clipfrac"], 0.5)
    close(stats["ratio_mean"], 1.15)
    # approx_kl = mean ½ (log ρ)² = ½ (2·ln²1.5 + ln²0.5 + ln²1.1) / 4 = 0.102293
    expected_kl = 0.5 * (2 * math.log(1.5) ** 2 + math.log(0.5) ** 2 + math.log(1.1) ** 2) / 4
    close(stats["approx_kl"], expected_kl)
    assert abs(expected_kl - 0.102293) < 1e-6
    loss.backward()
    # clipped tokens and the padding get no gradient; unclipped ones get -A·ρ / 4
    close(new.grad, [[0.0, 1.5 / 4, 0.0], [-2.2 / 4, 0.0, 0.0]])


def test_value_loss_with_and_without_clipping():
    # c = 0.2, R = 1 everywhere
    # token  V    V_old  (V-R)²  V_clip            (V_clip-R)²  max    clipped wins?
    #   a    1.0  0.5    0       0.5+0.2 = 0.7     0.09         0.09   yes
    #   b    0.6  0.5    0.16    0.6 (in range)    0.16         0.16   no
    #   c    0.0  0.5    1.0     0.5-0.2 = 0.3     0.49         1.0    no
    # loss = ½ (0.09 + 0.16 + 1.0) / 3 = 0.208333;  vf_clipfrac = 1/3
    values = torch.tensor([[1.0, 0.6, 0.0, 42.0]])
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0, -42.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, 0.2)
    close(loss, 0.5 * 1.25 / 3)
    close(stats["vf_clipfrac"], 1 / 3)
    # no clipping: ½ (0 + 0.16 + 1.0) / 3 = 0.193333
    loss, stats = value_loss(values, old, returns, mask, None)
    close(loss, 0.5 * 1.16 / 3)
    close(stats["vf_clipfrac"], 0.0)


# --- logits ---------------------------------------------------------------------------------------


def test_entropy_by_hand():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e4, -1e4]]])
    # uniform over 4: ln 4 = 1.386294; probs (1/4, 3/4): 0.25·ln 4 + 0.75·ln(4/3) = 0.562335
    close(entropy_from_logits(logits), [[math.log(4), 0.562335]])


def test_logprobs_by_hand_and_in_bf16():
    logits = torch.tensor([[[0.0, 0.0, math.log(2)], [0.0, 0.0, math.log(2)]]])
    labels = torch.tensor([[2, 0]])
    # probs (1/4, 1/4, 1/2)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32 and out.shape == (1, 2)
    close(out, [[math.log(0.5), math.log(0.25)]])
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(2, 5, 50, generator=gen) * 30  # large logits: naive softmax would overflow
    labels = torch.randint(0, 50, (2, 5), generator=gen)
    reference = torch.log_softmax(big.double(), -1).gather(-1, labels[..., None])[..., 0]
    close(logprobs_from_logits(big, labels), reference, tol=1e-4)
    half = big.to(torch.bfloat16)
    out = logprobs_from_logits(half, labels)
    assert out.dtype == torch.float32
    reference = torch.log_softmax(half.double(), -1).gather(-1, labels[..., None])[..., 0]
    close(out, reference, tol=1e-4)  # exact on the bf16 values, computed in float32
    with pytest.raises(ValueError, match="do not match"):
        logprobs_from_logits(big, labels[:, :3])


# --- KL controllers and checks --------------------------------------------------------------------


def test_adaptive_kl_controller_one_step():
    ctl = AdaptiveKLController(init_beta=0.1, target=6.0, horizon=10000)
    # KL 6.6: error = 6.6/6 - 1 = 0.1 (inside ±0.2); β = 0.1 · (1 + 0.1 · 1000/10000) = 0.101
    ctl.update(6.6, n_steps=1000)
    assert ctl.value == pytest.approx(0.101)
    # KL 18: error 2 clipped to 0.2; β = 0.101 · (1 + 0.2 · 256/10000) = 0.101 · 1.00512 = 0.10151712
    ctl.update(18.0, n_steps=256)
    assert ctl.value == pytest.approx(0.10151712)
    # KL 0: error -1 clipped to -0.2; β · (1 - 0.00512)
    ctl.update(0.0, n_steps=256)
    assert ctl.value == pytest.approx(0.10151712 * 0.99488)
    restored = AdaptiveKLController(0.5, 6.0, 10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_fixed_kl_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, n_steps=1000)
    assert ctl.value == 0.05


def test_is_finite_batch():
    ok = torch.ones(2, 3)
    assert is_finite_batch(ok, torch.zeros(4), 1.0, None)
    assert not is_finite_batch(ok, torch.tensor([1.0, float("nan")]))
    assert not is_finite_batch(torch.tensor([float("-inf")]))
    assert is_finite_batch()


# ---------------------------------------------------------------------------------------------
# Group-normalised step advantages (DeepSeekMath's process supervision)


def test_group_step_advantages_match_hand_computed_values():
    # one prompt, two samples of 4 tokens; sample 0 has steps ending at tokens 1 and 3 (rewards
    # 0.2, 0.8), sample 1 one step ending at token 2 (reward 0.5) and padding at token 3
    rewards = torch.tensor([[0.0, 0.2, 0.0, 0.8], [0.0, 0.0, 0.5, 0.0]])
    marks = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    adv, stats = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2)
    mean = (0.2 + 0.8 + 0.5) / 3
    std = (((0.2 - mean) ** 2 + (0.8 - mean) ** 2 + (0.5 - mean) ** 2) / 3) ** 0.5
    r = [(x - mean) / (std + 1e-6) for x in (0.2, 0.8, 0.5)]
    expected = torch.tensor([[r[0] + r[1], r[0] + r[1], r[1], r[1]], [r[2], r[2], r[2], 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert stats["flat_groups"] == 0.0


def test_group_step_advantages_with_own_step_credit_match_hand_computed_values():
    # the same group as above; with credit="own" a token gets its own step's normalised reward
    # (the first mark at or after it) and nothing from later steps; a token after a sample's last
    # mark (sample 1, token 3 unmasked here) gets 0; an outcome-only group is the same either way
    rewards = torch.tensor([[0.0, 0.2, 0.0, 0.8], [0.0, 0.0, 0.5, 0.0]])
    marks = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1]])
    adv, _ = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, credit="own")
    mean = (0.2 + 0.8 + 0.5) / 3
    std = (((0.2 - mean) ** 2 + (0.8 - mean) ** 2 + (0.5 - mean) ** 2) / 3) ** 0.5
    r = [(x - mean) / (std + 1e-6) for x in (0.2, 0.8, 0.5)]
    expected = torch.tensor([[r[0], r[0], r[1], r[1]], [r[2], r[2], r[2], 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    outcome = torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2)
    assert torch.equal(ppo_math.group_step_advantages(*outcome, group_size=2, credit="own")[0],
                       ppo_math.group_step_advantages(*outcome, group_size=2)[0])
    with pytest.raises(ValueError, match="credit"):
        ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, credit="future")


def test_centered_and_raw_step_rewards_give_the_same_group_advantages():
    """Under the group estimator, 'centered' (p - 0.5) and 'raw' (p) step rewards are one credit form:
    every marked reward of a group moves by the same constant, which the group mean takes off
    (under scale "group" and "none"; "batch" divides by a spread a shift leaves alone too)."""
    from rl.step_rewards import shape_step_rewards

    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(6, 5, generator=gen)  # three groups of two samples, 5 tokens, every 2nd a step end
    marks = torch.tensor([[0, 1, 0, 1, 1]] * 6)
    marks[1, 4] = 0  # samples with different numbers of steps
    marks[4, 3] = 0
    mask = torch.ones(6, 5)

    def shaped(mode: str) -> torch.Tensor:
        out = torch.zeros(6, 5)
        for i in range(6):
            ends = marks[i].nonzero().flatten().tolist()
            for k, value in zip(ends, shape_step_rewards(scores[i, ends].tolist(), mode)):
                out[i, k] = value
        return out

    for credit in ("return", "own"):
        for scale in ("group", "none", "batch"):
            raw, _ = ppo_math.group_step_advantages(shaped("raw"), marks, mask, 2, credit=credit, scale=scale)
            centered, _ = ppo_math.group_step_advantages(shaped("centered"), marks, mask, 2, credit=credit,
                                                         scale=scale)
            assert torch.allclose(raw, centered, atol=1e-5), (credit, scale)
            assert raw.abs().sum() > 0
    # 'delta' is another form: its rewards differ by more than a constant
    delta, _ = ppo_math.group_step_advantages(shaped("delta"), marks, mask, 2)
    assert not torch.allclose(delta, ppo_math.group_step_advantages(shaped("raw"), marks, mask, 2)[0], atol=1e-3)


def test_group_outcome_rewards_are_grpo_and_flat_groups_carry_nothing():
    # an outcome reward on the last token of each sample is GRPO: (r - mean) / std of the group,
    # on every token of the response; the second group's samples all scored 1: no signal
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    marks = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]])
    adv, stats = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2)
    a = 0.5 / (0.5 + 1e-6)
    assert torch.allclose(adv[:2], torch.tensor([[a, a], [-a, -a]]), atol=1e-6)
    assert torch.equal(adv[2:], torch.zeros(2, 2))
    assert stats["flat_groups"] == 0.5


def test_group_advantages_scaled_by_the_batch_or_not_at_all_match_hand_computed_values():
    # two groups of two outcome rewards: group 0 right (1) against wrong (0), group 1 two wrong
    # samples a verifier scored 0.25 and 0.15 (weight already applied). Under "group" both groups
    # get advantages of +-1; under "batch" each group's centred rewards are divided by the std of
    # all four rewards; under "none" they stay centred rewards
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.25], [0.0, 0.15]])
    marks = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])
    mask = torch.ones(4, 2)
    group, _ = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, scale="group")
    assert torch.allclose(group[:, 0], torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-4)
    values = [1.0, 0.0, 0.25, 0.15]
    mean = sum(values) / 4
    batch_std = (sum((v - mean) ** 2 for v in values) / 4) ** 0.5
    centred = [0.5, -0.5, 0.05, -0.05]
    batch, stats = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, scale="batch")
    assert torch.allclose(batch[:, 0], torch.tensor([c / (batch_std + 1e-6) for c in centred]), atol=1e-5)
    assert torch.allclose(batch[:, 0], batch[:, 1]) and stats["flat_groups"] == 0.0
    none, _ = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, scale="none")
    assert torch.allclose(none[:, 0], torch.tensor(centred), atol=1e-6)
    # the weight of a reward that alone varies in a group does nothing under "group", and scales
    # that group's advantages under "batch"
    halved = rewards.clone()
    halved[2:] *= 0.5
    assert torch.allclose(ppo_math.group_step_advantages(halved, marks, mask, 2, scale="group")[0][2:], group[2:],
                          atol=1e-4)
    assert ppo_math.group_step_advantages(halved, marks, mask, 2, scale="batch")[0][2, 0] < batch[2, 0] * 0.6
    # a flat group is 0 whatever the scale
    flat = torch.tensor([[0.0, 1.0], [0.0, 1.0]]), torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2)
    for scale in ppo_math.REWARD_SCALES:
        assert torch.equal(ppo_math.group_step_advantages(*flat, group_size=2, scale=scale)[0], torch.zeros(2, 2))
    with pytest.raises(ValueError, match="scale"):
        ppo_math.group_step_advantages(rewards, marks, mask, group_size=2, scale="global")


def test_group_advantages_ignore_unmarked_tokens_and_check_shapes():
    rewards = torch.tensor([[5.0, 1.0], [7.0, 0.0]])  # the 5 and 7 are not marked: not rewards
    marks = torch.tensor([[0, 1], [0, 1]])
    mask = torch.ones(2, 2)
    adv, _ = ppo_math.group_step_advantages(rewards, marks, mask, group_size=2)
    assert adv[0, 0] > 0 and adv[1, 0] < 0 and torch.allclose(adv[:, 0], adv[:, 1])
    with pytest.raises(ValueError):
        ppo_math.group_step_advantages(rewards, marks, mask, group_size=3)
    with pytest.raises(ValueError):
        ppo_math.group_step_advantages(rewards, marks[:1], mask, group_size=2)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert ppo_math.explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert ppo_math.explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0, abs=1e-6)
    assert ppo_math.explained_variance(-returns, returns, mask) < 0


def test_rl_comparison_pairs_runs_by_seed_and_problem():
    """`scripts/rl_comparison.py`'s difference against the first run name pairs the same seed's
    after-training rows problem by problem and ignores seeds only one name ran."""
    from scripts.rl_comparison import against_first

    first = {"0": {"a": 0.0, "b": 1.0, "c": 0.0}, "1": {"a": 1.0, "b": 1.0, "c": 0.0}}
    other = {"0": {"a": 1.0, "b": 1.0, "c": 1.0, "extra": 1.0}, "2": {"a": 0.0, "b": 0.0, "c": 0.0}}
    got = against_first(first, other, resamples=200)
    assert got["seeds"] == ["0"]  # seed 1 and seed 2 are not shared
    assert abs(got["diff"] - 2 / 3) < 1e-9 and got["ci_low"] <= got["diff"] <= got["ci_high"]
    assert against_first(first, {"7": {"a": 1.0}}, resamples=200) is None


def test_rl_comparison_sums_every_sampled_token_of_a_run(tmp_path):
    """The tokens column adds each update's `rollout/tokens` (rollouts and Monte Carlo continuations),
    skips probe rows, and is None for a run that never logged them (TRL's peer)."""
    from scripts.rl_comparison import _metric_rows, sampled_tokens

    run = tmp_path / "mc_s0"
    run.mkdir()
    rows = [{"update": 0, "probe/greedy_accuracy": 0.4}, {"update": 1, "rollout/tokens": 1200.0},
            {"update": 2, "rollout/tokens": 800.5}, {"update": 2, "probe/greedy_accuracy": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sampled_tokens(_metric_rows(run)) == pytest.approx(2000.5)
    (run / "metrics.jsonl").write_text(json.dumps({"update": 1, "loss": 0.1}) + "\n")
    assert sampled_tokens(_metric_rows(run)) is None


def test_rl_comparison_table_and_plot_from_run_folders(tmp_path, capsys):
    """Two names over two seeds: the table has each seed's training seconds and sampled tokens (a
    dash for a run that logs none), and the plot is written with its equal-time panel."""
    from scripts.rl_comparison import main as comparison

    def run(name, seed, after, seconds, tokens):
        d = tmp_path / f"{name}_s{seed}"
        d.mkdir()
        before = [1, 0, 0, 1]
        for which, correct in (("before", before), ("after", after)):
            (d / f"eval_{which}_rows.jsonl").write_text(
                "".join(json.dumps({"id": f"p{i}", "correct": c}) + "\n" for i, c in enumerate(correct)))
        (d / "eval.json").write_text(json.dumps({"train_seconds": seconds, "updates": 2, "responses_per_update": 8}))
        rows = [{"update": 0, "rollouts": 0, "elapsed": 0.0, "probe/greedy_accuracy": 0.5}]
        rows += [{"update": u, **({"rollout/tokens": tokens} if tokens else {})} for u in (1, 2)]
        rows += [{"update": 2, "rollouts": 16, "elapsed": seconds, "probe/greedy_accuracy": 0.75}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(d)

    runs = [run("gold", 0, [1, 1, 0, 1], 10.0, 100.0), run("gold", 1, [1, 0, 1, 1], 12.0, 100.0),
            run("peer", 0, [1, 1, 1, 1], 30.0, None), run("peer", 1, [1, 1, 1, 0], 34.0, None)]
    assert comparison(runs + ["--out", str(tmp_path / "cmp"), "--resamples", "50"]) == 0
    table = (tmp_path / "cmp.md").read_text().splitlines()
    gold = next(line for line in table if line.startswith("| gold |"))
    peer = next(line for line in table if line.startswith("| peer |"))
    assert "| 10, 12 | 0.00, 0.00 |" in gold  # 200 tokens per seed, in millions
    assert "| 30, 34 | —, — |" in peer
    assert (tmp_path / "cmp.png").stat().st_size > 0
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert result["gold"]["tokens_sampled"] == [200.0, 200.0] and result["peer"]["train_seconds"] == [30.0, 34.0]
    assert result["gold"]["mean_change"] == pytest.approx(0.25)


def test_rl_comparison_says_whether_each_run_held():
    """The issue's rule for a reward that was not hacked: the probe never more than 2 points below
    its start and steps per response (mean of the last ten updates) within 20% of the first ten's."""
    from scripts.rl_comparison import _held_cell, held

    def rows(probe, steps):
        return ([{"update": u, "probe/greedy_accuracy": p} for u, p in enumerate(probe)]
                + [{"update": u + 1, "rollout/steps_per_response": x} for u, x in enumerate(steps)])

    ok = held(rows([0.50, 0.49, 0.55], [3.5, 2.5] * 5 + [2.5] * 10))  # a 1-point dip, steps 3.0 -> 2.5
    assert ok["held"] is True and ok["probe_lowest"] == 0.49 and ok["steps_first"] == pytest.approx(3.0)
    assert ok["steps_last"] == pytest.approx(2.5)
    dipped = held(rows([0.50, 0.47, 0.60], [3.0] * 11))  # 3 points below the start once
    assert dipped["held"] is False
    shorter = held(rows([0.50, 0.52], [3.0] * 10 + [2.0] * 10))  # last ten: 2.0, -33%
    assert shorter["held"] is False and shorter["steps_last"] == pytest.approx(2.0)
    assert held(rows([0.5, 0.6], []))["held"] is None  # a TRL baseline logs no steps
    assert _held_cell([ok, dipped]) == "yes (-0.01, 3.00→2.50); NO (-0.03, 3.00→3.00)"


def test_rl_comparison_takes_a_run_at_one_of_its_checkpoints(tmp_path, capsys):
    """`RUN@N` is the run at checkpoint N: the greedy rows rl.tools.checkpoint_curve kept for it, the
    seconds logged when update N ended, the tokens and probe up to N; grouped as NAME@N, so a long
    run is compared with a short one at the same update. Without the kept rows it is a one-line error."""
    from scripts.rl_comparison import main as comparison

    def run(name, after, updates, curve=None):
        d = tmp_path / f"{name}_s0"
        (d / "checkpoint_rows").mkdir(parents=True)
        for which, correct in (("before", [0, 0, 0, 0]), ("after", after)):
            (d / f"eval_{which}_rows.jsonl").write_text(
                "".join(json.dumps({"id": f"p{i}", "correct": c}) + "\n" for i, c in enumerate(correct)))
        for update, correct in (curve or {}).items():
            (d / "checkpoint_rows" / f"update-{update}.jsonl").write_text(
                "".join(json.dumps({"id": f"p{i}", "correct": c}) + "\n" for i, c in enumerate(correct)))
        (d / "eval.json").write_text(json.dumps({"train_seconds": 10.0 * updates, "updates": updates,
                                                 "responses_per_update": 8}))
        rows = [{"update": 0, "rollouts": 0, "elapsed": 0.0, "probe/greedy_accuracy": 0.5}]
        for u in range(1, updates + 1):  # the probe in the update's own row, as rl/ppo_step.py writes it
            rows.append({"update": u, "elapsed": 10.0 * u, "rollout/tokens": 100.0, "rollouts": 8 * u,
                         "probe/greedy_accuracy": 0.5 + u / 10})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(d)

    short = run("gold", [1, 1, 0, 0], 2)
    long = run("psv", [1, 1, 1, 1], 4, curve={2: [1, 0, 0, 0], 4: [1, 1, 1, 1]})
    assert comparison([short, long + "@2", long, "--out", str(tmp_path / "cmp"), "--resamples", "50"]) == 0
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert result["psv@2"]["changes"] == [pytest.approx(0.25)] and result["psv"]["changes"] == [pytest.approx(1.0)]
    assert result["psv@2"]["train_seconds"] == [20.0] and result["psv"]["train_seconds"] == [40.0]
    assert result["psv@2"]["tokens_sampled"] == [200.0] and result["psv"]["tokens_sampled"] == [400.0]
    assert result["psv@2"]["rollouts_to_target"] == [8] and result["psv@2"]["seconds_per_update"] == 10.0
    assert result["psv@2"]["after_minus_first"]["diff"] == pytest.approx(-0.25)  # 1 of 4 against 2 of 4

    capsys.readouterr()
    assert comparison([short, long + "@3", "--out", str(tmp_path / "cmp2")]) == 2
    err = capsys.readouterr().err
    assert "update-3.jsonl" in err and "rl.tools.checkpoint_curve" in err and len(err.strip().splitlines()) == 1


def test_group_advantages_mark_the_rows_of_groups_without_signal():
    """Three groups of two samples over three tokens: rewards that differ (signal), equal step rewards
    placed at different tokens (flat: the same multiset), and a group with a single marked reward
    (flat); unmarked tokens and padding are ignored whatever they hold."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0],      # group 0: 1 vs 0 -> signal
                            [0.5, 9.0, 0.0], [0.0, 0.5, 0.0],      # group 1: 0.5 and 0.5 (9.0 unmarked) -> flat
                            [0.0, 0.0, 0.7], [3.0, 0.0, 0.0]])     # group 2: one mark (the 3.0 is padding) -> flat
    reward_mask = torch.tensor([[0, 0, 1], [0, 0, 1],
                                [1, 0, 0], [0, 1, 0],
                                [0, 0, 1], [1, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1],
                         [1, 1, 1], [1, 1, 0],
                         [1, 1, 1], [0, 1, 1]])
    advantages, stats = ppo_math.group_step_advantages(rewards, reward_mask, mask, 2)
    assert stats["flat_rows"].tolist() == [False, False, True, True, True, True]
    assert stats["flat_groups"] == pytest.approx(2 / 3)
    assert advantages[2:].abs().sum() == 0 and advantages[:2].abs().sum() > 0  # the same groups, seen alike
    with pytest.raises(ValueError, match="groups of 4"):
        ppo_math.group_step_advantages(rewards, reward_mask, mask, 4)


# --- Monte Carlo step values (VinePPO) ------------------------------------------------------------


def test_token_steps_from_ends_by_hand():
    from rl.ppo_math import token_steps_from_ends

    # ends 1, 3, 5 over 8 tokens: tokens 0-1 step 0, 2-3 step 1, 4-5 step 2, and 6-7 (after the
    # last end: an EOS, padding) join the last step
    close(token_steps_from_ends([[1, 3, 5]], 8), [[0, 0, 1, 1, 2, 2, 2, 2]])
    # one step, no step (a response with no marker), two steps ending on one token
    close(token_steps_from_ends([[2], [], [1, 1, 3]], 5), [[0] * 5, [0] * 5, [0, 0, 2, 2, 2]])
    assert token_steps_from_ends([], 3).shape == (0, 3)
    with pytest.raises(ValueError, match="non-decreasing"):
        token_steps_from_ends([[3, 1]], 5)


def test_step_value_advantages_by_hand():
    from rl.ppo_math import step_value_advantages

    # row 0: three steps ending at tokens 1, 3, 4, then an EOS (token 5)
    #   V(s_0..s_3) = 0.5, 0.75, 0.25, 1.0 -> steps: +0.25, -0.5, +0.75 (the EOS takes the last step's)
    # row 1: one step over 4 tokens, then padding: V = 0.25, 0.0 -> -0.25 on every real token
    # row 2: no step marker, 3 tokens: one step, V = 2/3 (the prompt's), 1.0 (its reward) -> +1/3
    # the 9s are padding values and the 7s padding steps: never read
    values = torch.tensor([[0.5, 0.75, 0.25, 1.0], [0.25, 0.0, 9.0, 9.0], [2 / 3, 1.0, 9.0, 9.0]])
    steps = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 7, 7], [0, 0, 0, 7, 7, 7]])
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 3 + [0.0] * 3])
    adv = step_value_advantages(values, steps, mask)
    close(adv, [[0.25, 0.25, -0.5, -0.5, 0.75, 0.75],
                [-0.25, -0.25, -0.25, -0.25, 0.0, 0.0],
                [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0]])
    # the advantages of a response telescope: their per-step sum is V(end) - V(prompt)
    assert 0.25 - 0.5 + 0.75 == pytest.approx(1.0 - 0.5)
    close(step_value_advantages(values, steps, mask.bool()), adv)
    with pytest.raises(ValueError, match="outside"):  # a real token of a step with no value
        step_value_advantages(values[:, :2], steps, mask)
    with pytest.raises(ValueError, match="one shape"):
        step_value_advantages(values, steps[:, :5], mask)


def test_rloo_estimator_is_the_return_against_the_leave_one_out_mean():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    settings = SimpleNamespace(gamma=1.0, num_generations=2)  # the fields of StepPPOConfig that rloo reads
    out = ppo_math.ESTIMATORS["rloo"].estimate(ppo_math.AdvantageBatch(rewards, mask), settings)
    # returns-to-go from the first token: 1, 3 | 2, 0; baselines: the other sample's
    assert out.advantages.tolist() == [[-2.0, -2.0], [2.0, 2.0], [2.0, 0.0], [-2.0, -2.0]]
    assert out.returns.tolist() == [[1.0, 1.0], [3.0, 3.0], [2.0, 0.0], [0.0, 0.0]]
    assert not out.values.any() and out.flat_rows is None


def test_an_estimator_is_one_registered_function_whose_flags_the_settings_read(tmp_path):
    """A new estimator is one function of (batch, settings) registered with its capability flags;
    the settings' checks read those flags from the registry, and a name is registered once."""
    from rl.ppo_config import StepPPOConfig

    @ppo_math.register_estimator("test_zero", groups=True, kl_in_loss=True)
    def zero(batch, cfg):
        return ppo_math.Advantages(torch.zeros_like(batch.rewards), batch.rewards, torch.zeros_like(batch.rewards))

    try:
        estimator = ppo_math.ESTIMATORS["test_zero"]
        assert estimator.estimate is zero and estimator.groups and not estimator.uses_critic
        rewards = torch.ones(2, 3)
        assert not estimator.estimate(ppo_math.AdvantageBatch(rewards, torch.ones(2, 3)), None).advantages.any()
        with pytest.raises(ValueError, match="registered twice"):
            ppo_math.register_estimator("test_zero")(zero)
        StepPPOConfig(output_dir=str(tmp_path / "a"), advantage_estimator="test_zero", num_generations=2)
        with pytest.raises(ValueError, match="test_zero needs --num_generations >= 2"):  # its `groups` flag
            StepPPOConfig(output_dir=str(tmp_path / "b"), advantage_estimator="test_zero", num_generations=1)
        with pytest.raises(ValueError, match="--drop_flat_groups needs"):  # no `drops_flat_groups` flag
            StepPPOConfig(output_dir=str(tmp_path / "c"), advantage_estimator="test_zero", drop_flat_groups=True)
    finally:
        ppo_math.ESTIMATORS.pop("test_zero", None)
    assert tuple(ppo_math.ESTIMATORS) == ("gae", "rloo", "group", "mc_values")
