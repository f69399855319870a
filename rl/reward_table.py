"""A batch's rewards as a table: every reward function's output on every response (rows: functions,
columns: responses), weighed per response into step rewards and a last-token reward, with the
tally the trainer logs; and where a response's steps end in its tokens, so that step rewards are
paid there (`rl.step_rewards.assign_rewards` places them). `RewardPlacer` does all of it for one
batch of rollouts: the table, the weighing, the placement on tokens, clipping and normalising."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from reasoning.prompts import solve_prompt
from reasoning.steps import answer_correct, has_answer, split_steps
from reasoning.types import Problem
from rl.batches import Rollouts
from rl.ppo_config import StepPPOConfig
from rl.rewards import ScoredRewards, WeightedReward, call_reward_func
from rl.step_rewards import (
    RunningMeanStd,
    assign_rewards,
    char_to_token_positions,
    clip_rewards,
    offsets_from_token_ids,
    step_end_char_positions,
)


@dataclass
class Responses:
    """A batch's responses as the reward functions read them: token ids (EOS included), the ids
    without a final EOS (what the text was decoded from), lengths and steps."""

    ids: list[list[int]]
    bodies: list[list[int]]
    lengths: list[int]
    paths: list[Any]

    @classmethod
    def of(cls, response_ids: torch.Tensor, response_mask: torch.Tensor, texts: list[str], tok) -> Responses:
        """From right-padded response ids [N, R], their mask and decoded texts."""
        lengths = response_mask.sum(-1).long().tolist()
        ids = [response_ids[i, :length].tolist() for i, length in enumerate(lengths)]
        return cls(ids, [without_eos(row, tok.eos_token_id) for row in ids], lengths, [split_steps(t) for t in texts])


@dataclass
class RewardTally:
    """What one batch's rewards paid and what its responses were like, counted as they are placed."""

    paid: dict[str, float]
    paid_by_func: list[float]
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("truncated", "no_answer", "no_steps", "correct", "steps", "step_score_sum", "scored_steps"), 0))
    unlocated: int = 0
    answer_match: str = "strict"
    """The answer check that counts a response correct (the run's --answer_match)."""
    unscorable: int = 0
    """Responses a verifier reward could not score (refused by the verifier: too long for its context)."""
    totals: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, funcs: list[WeightedReward], table: list[list[Any]], answer_match: str = "strict"
              ) -> RewardTally:
        """A tally of the batch whose reward table (one row per function of `funcs`) is `table`."""
        tally = cls({kind: 0.0 for kind in ("verifier", "gold", "penalty", "user")}, [0.0] * len(funcs),
                    answer_match=answer_match)
        for r, row in zip(funcs, table):  # the verifier's step scores behind its rewards, for the mean step score
            if not isinstance(row, ScoredRewards):
                continue
            tally.unscorable += row.unscorable if r.kind == "verifier" else 0
            for s in row.scores:
                if s is not None:
                    tally.counts["step_score_sum"] += sum(s)
                    tally.counts["scored_steps"] += len(s)
        return tally

    def count_response(self, text: str, problem: Problem, responses: Responses, i: int, eos: int) -> None:
        self.counts["steps"] += len(responses.paths[i].steps)
        self.counts["correct"] += int(answer_correct(text, problem, self.answer_match))
        self.counts["truncated"] += int(not responses.ids[i] or responses.ids[i][-1] != eos)
        self.counts["no_answer"] += int(not has_answer(text))

    def weigh(self, funcs: list[WeightedReward], row: list[Any], n_steps: int
              ) -> tuple[list[float | None], float, bool]:
        """One response's row of the reward table, weighed: (the reward of each step, None where no
        function paid it; the reward at the last token; whether anything is paid there)."""
        per_step: list[float | None] = [None] * n_steps
        outcome, at_last = 0.0, False
        for f, (r, value) in enumerate(zip(funcs, row)):
            if value is None:
                if r.kind == "verifier":
                    self.counts["no_steps"] += 1
                continue
            if isinstance(value, (list, tuple)):
                if len(value) != n_steps:
                    raise ValueError(f"reward function {r.name!r} returned {len(value)} step rewards for a "
                                     f"completion of {n_steps} steps")
                for k, v in enumerate(value):
                    if v is not None:
                        per_step[k] = (per_step[k] or 0.0) + r.weight * float(v)
                got = r.weight * sum(float(v) for v in value if v is not None)
            else:
                got = r.weight * float(value)
                outcome += got
                at_last = True
            self.paid[r.kind] += got
            self.paid_by_func[f] += got
        return per_step, outcome, at_last

    def metrics(self, rewards: torch.Tensor, lengths: list[int], group_size: int,
                funcs: list[WeightedReward]) -> dict[str, float]:
        n, c = len(lengths), self.counts
        groups = [self.totals[j : j + group_size] for j in range(0, len(self.totals), group_size)]
        out = {
            "rollout/same_reward_groups": sum(max(g) - min(g) < 1e-9 for g in groups) / max(len(groups), 1),
            "reward/mean_total": rewards.sum(-1).mean().item(),
            "reward/verifier_mean": self.paid["verifier"] / n,
            "reward/gold_mean": self.paid["gold"] / n,
            "reward/penalty_mean": -self.paid["penalty"] / n,
            "verifier/mean_step_score": c["step_score_sum"] / max(c["scored_steps"], 1),
            "rollout/accuracy": c["correct"] / n,
            "rollout/steps_per_response": c["steps"] / n,
            "rollout/tokens_per_step": sum(lengths) / max(c["steps"], 1),
            "rollout/response_tokens": sum(lengths) / n,
            "rollout/truncated_frac": c["truncated"] / n,
            "rollout/no_answer_frac": c["no_answer"] / n,
            "rollout/no_steps_frac": (c["no_steps"] - self.unscorable) / n,
            "verifier/unscorable_frac": self.unscorable / n,
            "rollout/unlocated_steps_frac": self.unlocated / n,
        }
        for r, total in zip(funcs, self.paid_by_func):
            if r.kind == "user":
                out[f"reward/{r.name}_mean"] = total / n
        return out


def without_eos(ids: list[int], eos: int) -> list[int]:
    """A response's token ids without its final EOS (the tokens its text was decoded from)."""
    return ids[:-1] if ids and ids[-1] == eos else ids


def step_end_tokens(tok, body: list[int], text: str, n_steps: int) -> list[int] | None:
    """The response token at which each of the `n_steps` steps of `text` (decoded from `body`)
    ends; None when they cannot be located in the tokens (a different count of step ends, or
    offsets that do not map)."""
    if n_steps == 0:
        return []
    ends = step_end_char_positions(text)
    if len(ends) != n_steps or not body:
        return None
    try:
        return char_to_token_positions(offsets_from_token_ids(tok, body), ends)
    except ValueError:
        return None


class RewardPlacer:
    """A batch's rewards on its tokens: every reward function (`reward_funcs`, `rl.rewards`) called
    once on the batch, its per-step outputs placed on the tokens that end their steps, its
    per-sequence outputs on the last token, each times its weight; then --reward_clip and
    --reward_normalize (whose running statistics, `stats`, a checkpoint keeps)."""

    def __init__(self, config: StepPPOConfig, tokenizer, reward_funcs: list[WeightedReward], device):
        self.args, self.tokenizer, self.reward_funcs, self.device = config, tokenizer, reward_funcs, device
        self.stats = RunningMeanStd()

    def __call__(self, batch: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """Placed rewards [N, R] (before the KL penalty) and reward statistics of this batch; sets
        `batch.reward_mask` (1 where a reward was placed)."""
        responses = Responses.of(batch.response_ids, batch.response_mask, batch.texts, self.tokenizer)
        table = self.table(batch, responses)
        rewards, reward_mask, tally = self.place(batch, responses, table)
        if self.args.reward_clip is not None:
            rewards = clip_rewards(rewards, self.args.reward_clip)
        mask = batch.response_mask.cpu()
        if self.args.reward_normalize:
            self.stats.update(rewards[mask.bool()].tolist())
            rewards = rewards / max(self.stats.std, 1e-6)
        rewards = rewards * mask
        batch.reward_mask = (reward_mask * mask).to(self.device)
        metrics = tally.metrics(rewards, responses.lengths, self.args.num_generations, self.reward_funcs)
        return rewards.to(self.device), metrics

    def table(self, batch: Rollouts, responses: Responses) -> list[list[Any]]:
        """Every reward function's output on every response: row f is function f's outputs, one
        per response (a float, a list of per-step floats, or None where it has nothing to say)."""
        tok = self.tokenizer
        columns = {"question": [p.question for p in batch.problems], "answer": [p.answer for p in batch.problems],
                   "id": [p.id for p in batch.problems], "problems": list(batch.problems),
                   "steps": [list(p.steps) for p in responses.paths], "eos_token_id": tok.eos_token_id}
        prompts = [solve_prompt(p.question) for p in batch.problems]
        return [call_reward_func(r, prompts, batch.texts, responses.ids, columns) for r in self.reward_funcs]

    def place(self, batch: Rollouts, responses: Responses, table: list[list[Any]]
              ) -> tuple[torch.Tensor, torch.Tensor, RewardTally]:
        """The weighed rewards of every response on its tokens ([N, R]), where any was placed
        ([N, R] mask: every credited step end, and the last token when something is paid there),
        and the batch's tally."""
        n, width = batch.response_ids.shape
        rewards, reward_mask = torch.zeros((n, width)), torch.zeros((n, width))
        tally = RewardTally.start(self.reward_funcs, table, self.args.answer_match)
        for i in range(n):
            n_tokens = max(responses.lengths[i], 1)
            tally.count_response(batch.texts[i], batch.problems[i], responses, i, self.tokenizer.eos_token_id)
            per_step, outcome, at_last = tally.weigh(self.reward_funcs, [column[i] for column in table],
                                                     len(responses.paths[i].steps))
            paid = {k: v for k, v in enumerate(per_step) if v is not None}
            credited = list(paid)
            positions: list[int] = []
            if credited:
                at = step_end_tokens(self.tokenizer, responses.bodies[i], batch.texts[i],
                                     len(responses.paths[i].steps))
                if at is None:  # the steps could not be located in tokens: the same total, at the path's end
                    tally.unlocated += 1
                    outcome += sum(paid[k] for k in credited)
                    credited = []
                else:
                    positions = [at[k] for k in credited]
            placed = assign_rewards([paid[k] for k in credited], positions, n_tokens, outcome=outcome,
                                    last_token=n_tokens - 1)
            rewards[i, :n_tokens] = torch.tensor(placed[:n_tokens])
            tally.totals.append(sum(placed))
            for position in positions:
                reward_mask[i, position] = 1.0
            if not positions or at_last:
                reward_mask[i, n_tokens - 1] = 1.0
        return rewards, reward_mask, tally
