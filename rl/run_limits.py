"""When a PPO run stops short of --max_steps, and what it has spent on the way.

`RunLimits.after_update` is called once per update, on every process, with the update's metrics
(means over the processes). It adds the length-drift guard's metrics (`rl.length_drift`: one
warning line per crossing of --length_drift_threshold) and `rollout/tokens_cumulative`, the tokens
sampled since the run began (responses and every continuation, mc_values' and the prover's, summed
over the processes and over resumed segments), and returns why the run ends after this update:

- 'length_drift': the drift crossed its threshold and --stop_on_length_drift is set;
- 'max_generated_tokens': the next update, taken to sample as many tokens as this one, would end
  past --max_generated_tokens (so a run ends within about one update's tokens below its budget;
  it passes it only where an update samples more than the one before, or the first alone does);
- 'max_train_seconds': the next update, taken to last as long as this one, would end past
  --max_train_seconds;
- None: go on (and always at --max_steps, where the run ends anyway).

Rank 0 decides for every rank. The spent tokens and the guard's window are part of a checkpoint
(`state_dict`), so a resumed run goes on counting where it stopped.
"""

from __future__ import annotations

import sys
from typing import Any

from rl import distributed as D
from rl.length_drift import LengthDriftGuard


def _say(msg: str) -> None:
    print(f"[ppo_step] {msg}", file=sys.stderr, flush=True)


class RunLimits:
    def __init__(self, config, accelerator):
        self.args, self.accelerator = config, accelerator
        self.length_guard = LengthDriftGuard(config.length_drift_updates, config.length_drift_threshold)
        self.generated_tokens = 0.0
        """Tokens sampled since the run began, every process and resumed segment."""

    def after_update(self, update: int, metrics: dict[str, float], segment_seconds: float,
                     update_seconds: float) -> str | None:
        """`metrics` completed with the guard's metrics and rollout/tokens_cumulative; why the run
        stops after `update` (the module's list), or None. `segment_seconds`: this launch's training
        time so far; `update_seconds`: this update's."""
        args, main = self.args, self.accelerator.is_main_process
        sampled = metrics.get("rollout/tokens", 0.0) * self.accelerator.num_processes  # a mean over ranks
        self.generated_tokens += sampled
        metrics["rollout/tokens_cumulative"] = self.generated_tokens
        drift, crossed = self.length_guard.observe(metrics.get("rollout/steps_per_response", 0.0),
                                                   metrics.get("rollout/response_tokens", 0.0))
        metrics.update(drift)
        if crossed and main:
            _say(f"warning: length drift {drift['rollout/length_drift']:+.0%} at update {update} "
                 f"(past --length_drift_threshold {args.length_drift_threshold:g}): "
                 f"{self.length_guard.describe(drift)}; is the reward paying for length?")
        if update >= args.max_steps:
            return None
        where = f"stopping after update {update} of {args.max_steps}"
        if D.main_process_decides(crossed and args.stop_on_length_drift, self.accelerator):
            if main:
                _say(f"{where}: --stop_on_length_drift")
            return "length_drift"
        budget = args.max_generated_tokens
        if budget is not None and D.main_process_decides(self.generated_tokens + sampled > budget, self.accelerator):
            if main:
                _say(f"{where}: {self.generated_tokens:.0f} tokens sampled, and the next update would end past "
                     f"--max_generated_tokens {budget}")
            return "max_generated_tokens"
        limit = args.max_train_seconds
        if limit is not None and D.main_process_decides(segment_seconds + update_seconds > limit, self.accelerator):
            if main:
                _say(f"{where}: the next would end past --max_train_seconds {limit:g} "
                     "(--resume_from_checkpoint auto continues the run)")
            return "max_train_seconds"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"generated_tokens": self.generated_tokens, "length_drift": self.length_guard.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint's resume state; one written before a field existed restarts that field
        (no tokens counted before; the guard's baseline taken again from this update)."""
        self.generated_tokens = float(state.get("generated_tokens", 0.0))
        self.length_guard.load_state_dict(state.get("length_drift", {}))
