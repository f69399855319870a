r"""Progress rewards (PAV, Setlur et al. 2024): each step paid the change it makes in a *prover*
policy's chance of reaching a right answer, `--reward progress` and `--reward gold+progress`.

A response of steps ``1..n`` passes the states ``s_0`` (the prompt), ``s_1``, ..., ``s_n`` (the
whole response). ``Q(s_j)`` is the prover's success probability from ``s_j``, judged by the answer
check alone (1 right, 0 wrong; no verifier, no penalty), estimated from ``m`` continuations of the
prover sampled from ``s_j`` of which ``c`` were right. Step ``j``'s progress is::

    A_j = Q(s_j) − Q(s_{j−1})          so that   Σ_j A_j = Q(s_n) − Q(s_0)

``Q(s_n)`` is the response's own answer check (nothing is left to continue); ``Q(s_0)`` is, for the
current policy as the prover, the answer checks of the prompt's *other* samples (leave-one-out,
free, as `mc_values` takes it), and for the frozen starting policy (`--prover sft`) its own
continuations from the prompt, once per prompt (the group's samples come from another policy).

Best-of-K of a prover (`--prover_best_of K`) succeeds when any of K independent continuations does:
``Q_K = 1 − (1 − q)^K``. From ``c`` right of ``m`` continuations it is estimated by the unbiased
pass@K estimator ``1 − C(m − c, K) / C(m, K)`` when ``m ≥ K``, and by the plug-in ``1 − (1 − c/m)^K``
(biased: it understates Q_K for small m) when ``m < K``. A response's own end is one sample: 0 or 1.

Each ``α A_j`` (``α`` = `--progress_coef`) is a step reward placed on the token that ends step
``j``, as a verifier's step reward is; a response whose steps cannot be located in its tokens gets
its summed progress at its last token. The estimators then credit them as any step reward
(`--step_credit`). Pure functions here; the continuations are sampled in `rl.rollouts`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PROVERS = ("policy", "sft")
"""--prover: the policy being trained (its progress is VinePPO's value change), or the frozen
starting policy (the KL reference, `sft`)."""


def step_progress(q_row: Sequence[float]) -> list[float]:
    """A_j = Q(s_j) − Q(s_{j−1}) for j = 1..n, from one response's Q(s_0), ..., Q(s_n)."""
    if len(q_row) < 2:
        raise ValueError(f"a response's Q row holds Q(s_0) and Q(s_n) at least, got {list(q_row)}")
    return [after - before for before, after in zip(q_row[:-1], q_row[1:])]


def place_progress(rewards: torch.Tensor, reward_mask: torch.Tensor, q_rows: Sequence[Sequence[float]],
                   step_ends: Sequence[Sequence[int] | None], lengths: Sequence[int], coef: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """`rewards` [N, R] with `coef` × each step's progress added on the token ending the step, and
    `reward_mask` marked there. Row i's `step_ends[i]` are the tokens ending its steps (one per step
    of `q_rows[i]`); None (its steps not located in its tokens) puts its summed progress on its last
    token (`lengths[i] - 1`). Returns new tensors."""
    rewards, reward_mask = rewards.clone(), reward_mask.clone()
    for i, (row, ends) in enumerate(zip(q_rows, step_ends)):
        progress = step_progress(row)
        last = max(int(lengths[i]), 1) - 1
        if ends is None:
            ends, progress = [last], [sum(progress)]
        if len(ends) != len(progress):
            raise ValueError(f"response {i}: {len(progress)} steps of progress but {len(ends)} step ends")
        for end, value in zip(ends, progress):
            rewards[i, end] += coef * value
            reward_mask[i, end] = 1.0
    return rewards, reward_mask


def progress_stats(q_rows: Sequence[Sequence[float]], right: Sequence[float]) -> dict[str, float]:
    """Logged per update: the mean step progress on right and on wrong responses, the fraction of
    steps whose progress is 0 (the prover's chance unmoved: no signal), the mean Q(s_0), and the
    mean summed progress of a response (Q(s_n) − Q(s_0))."""
    steps = {True: [], False: []}  # type: dict[bool, list[float]]
    for row, ok in zip(q_rows, right):
        steps[bool(ok)].extend(step_progress(row))
    every = steps[True] + steps[False]
    n = max(len(q_rows), 1)
    return {
        "progress/step_mean_right": sum(steps[True]) / max(len(steps[True]), 1),
        "progress/step_mean_wrong": sum(steps[False]) / max(len(steps[False]), 1),
        "progress/zero_frac": sum(abs(a) < 1e-9 for a in every) / max(len(every), 1),
        "progress/q_start_mean": sum(row[0] for row in q_rows) / n,
        "progress/response_mean": sum(row[-1] - row[0] for row in q_rows) / n,
    }
