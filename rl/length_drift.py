"""The length-drift guard: has the policy's response length moved since the run began?

A reward that pays for length (DeepSeekMath's raw step rewards with return credit cut world
responses from 6 steps to 4, docs/results/when_step_rewards_pay.md) shows first in the length. Per
update u the trainer reads s_u = `rollout/steps_per_response` and t_u = `rollout/response_tokens`
(means over the update's responses, every process). With K = --length_drift_updates:

    baseline  S0 = mean(s_1 .. s_K),          T0 = mean(t_1 .. t_K)
    current   S  = mean(s_(u-K+1) .. s_u),    T  = mean(t_(u-K+1) .. t_u)
    rollout/length_drift_steps  = S / S0 - 1
    rollout/length_drift_tokens = T / T0 - 1
    rollout/length_drift        = the one of the two with the larger magnitude (its sign kept)

logged from update K + 1 on (before it the two windows are the same updates). A baseline of 0 gives
a drift of 0 for that measure. The guard warns when |rollout/length_drift| goes past the threshold
from at or below it (once per crossing: it may warn again only after falling back), and the trainer
can stop the run there (--stop_on_length_drift).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def relative_change(now: float, base: float) -> float:
    """now / base - 1; 0 for a baseline that is not positive."""
    return now / base - 1.0 if base > 0 else 0.0


def length_drift(first: Sequence[tuple[float, float]], last: Sequence[tuple[float, float]]) -> dict[str, float]:
    """The drift metrics of the (steps, tokens) per response of the latest updates (`last`) against
    those of the first updates (`first`), each averaged over its updates (the module's definition)."""
    if not first or not last:
        raise ValueError("length_drift needs at least one update in each window")

    def mean(rows, k):
        return sum(r[k] for r in rows) / len(rows)

    steps = relative_change(mean(last, 0), mean(first, 0))
    tokens = relative_change(mean(last, 1), mean(first, 1))
    return {"rollout/length_drift_steps": steps, "rollout/length_drift_tokens": tokens,
            "rollout/length_drift": steps if abs(steps) >= abs(tokens) else tokens}


@dataclass
class LengthDriftGuard:
    """The updates' lengths as they come, the drift metrics, and whether the drift has just crossed
    the threshold. Its state goes into checkpoints (`state_dict`), so a resumed run keeps its baseline."""

    updates: int = 3
    threshold: float = 0.2
    first: list[tuple[float, float]] = field(default_factory=list)
    last: list[tuple[float, float]] = field(default_factory=list)
    seen: int = 0
    """Updates observed."""
    above: bool = False
    """Whether the drift was past the threshold at the latest update."""

    def observe(self, steps: float, tokens: float) -> tuple[dict[str, float], bool]:
        """One update's steps and tokens per response: (the drift metrics, none until the baseline
        window is full and passed; whether the drift has just crossed the threshold)."""
        row = (float(steps), float(tokens))
        self.seen += 1
        if len(self.first) < self.updates:
            self.first.append(row)
        self.last = [*self.last, row][-self.updates:]
        if self.seen <= self.updates:
            return {}, False
        metrics = length_drift(self.first, self.last)
        above = abs(metrics["rollout/length_drift"]) > self.threshold
        crossed, self.above = above and not self.above, above
        return metrics, crossed

    def describe(self, metrics: dict[str, float]) -> str:
        """The warning line's account of a drift."""
        s0, t0 = (sum(r[k] for r in self.first) / len(self.first) for k in (0, 1))
        s, t = (sum(r[k] for r in self.last) / len(self.last) for k in (0, 1))
        return (f"steps per response {s0:.2f} -> {s:.2f} ({metrics['rollout/length_drift_steps']:+.0%}), "
                f"tokens per response {t0:.1f} -> {t:.1f} ({metrics['rollout/length_drift_tokens']:+.0%}), "
                f"the last {self.updates} updates against the first {self.updates}")

    def state_dict(self) -> dict[str, Any]:
        return {"first": [list(r) for r in self.first], "last": [list(r) for r in self.last], "seen": self.seen,
                "above": self.above}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = [(float(a), float(b)) for a, b in state.get("first", [])]
        self.last = [(float(a), float(b)) for a, b in state.get("last", [])]
        self.seen = int(state.get("seen", len(self.first)))
        self.above = bool(state.get("above", False))
