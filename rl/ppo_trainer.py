"""The step-level PPO trainer: the loop, the optimisation and the collectives. One update, as `step` reads:

1. rollouts: `prompts_per_update` prompts and `num_generations` responses each (`rl/rollouts.py`);
2. rewards: every reward function on every response, placed on the token that ends each step or on
   the last token, with the format penalties (`rl/reward_table.py`, `rl/rewards.py`); a progress
   reward adds each step's progress under a prover at its end (`rl/progress.py`, PAV); with
   `--verifier_online_update` an implicit PRM then learns from these rollouts' answer checks (PRIME);
3. log-probabilities under the policy as it sampled and under the reference (the base with adapters
   disabled under LoRA), the critic's values, the per-token KL;
4. advantages: a registered estimator (`rl/ppo_math.py`, `ESTIMATORS`: GAE over the critic, a
   leave-one-out baseline, group-normalised step rewards, or Monte Carlo values of the step
   boundaries that `rl/rollouts.py` samples first);
5. optimisation: `num_iterations` passes of minibatches on the clipped policy and value losses;
6. metrics, averaged over processes. The phases hand each other typed batches (`rl/batches.py`).

Policy and critic are wrapped in one module so DDP and DeepSpeed see one model and one optimizer;
what it is built from is `rl/ppo_prepare.py`'s, the greedy evaluation and probes `rl/ppo_eval.py`'s.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from backends.vllm_server import ServerError
from reasoning.jsonl import write_jsonl
from reasoning.types import Problem
from rl import distributed as D
from rl import fsdp2, tracking
from rl import ppo_math as M
from rl import ppo_prepare as P
from rl.batches import Advantages, LogProbs, Rollouts, StepValues
from rl.decoding import positions
from rl.greedy_accuracy import compare_greedy_rows
from rl.hub import push_folder
from rl.online_prm import online_update
from rl.ppo_config import StepPPOConfig
from rl.ppo_eval import PolicyEvaluator
from rl.problem_hooks import WORLD_HOOKS, ProblemHooks
from rl.reward_table import RewardPlacer
from rl.rewards import REWARDS, WeightedReward, build_reward_funcs
from rl.rollouts import RolloutSampler
from rl.run_dir import RunDir, prepare_run_dir
from rl.run_limits import RunLimits


class PolicyAndCritic(nn.Module):
    """The policy (causal LM) and the critic (one scalar per token) as one module."""

    def __init__(self, policy: nn.Module, critic: nn.Module | None):
        super().__init__()
        self.policy = policy
        self.critic = critic

    def forward(self, input_ids, attention_mask, position_ids, with_values: bool = True):
        logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        values = None
        if with_values and self.critic is not None:
            values = self.critic(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids).logits.squeeze(-1)
        return logits, values


class _Clock:
    """Seconds of an update's phases (`time/NAME`) and of the whole update."""

    def __init__(self):
        self.start, self.seconds = time.time(), {}

    def time(self, name: str, fn, *args):
        t = time.time()
        out = fn(*args)
        self.seconds[f"time/{name}"] = time.time() - t
        return out

    def total(self) -> float:
        return time.time() - self.start


class StepPPOTrainer:
    """Step-level PPO on `train_problems`. The rewards are `config.reward`'s (and the format
    penalties), plus `reward_funcs` (callables in TRL's `reward_funcs` shape, `rl.rewards`; per-step
    ones pay at step ends) weighted by `reward_weights` (default 1 each), after any `--reward_funcs`
    of the config."""

    def __init__(self, config: StepPPOConfig, policy, tokenizer, critic, verifier, train_problems: list[Problem],
                 eval_problems: list[Problem] | None = None, ref_policy=None,
                 probe_problems: list[Problem] | None = None, prompt_too_long: dict[str, int] | None = None,
                 hooks: ProblemHooks = WORLD_HOOKS, reward_funcs=None, reward_weights=None):
        from accelerate.utils import set_seed

        self.args = config  # checked when it was made (StepPPOConfig.validate)
        self.hooks = hooks
        if config.disable_dropout:
            P.without_dropout(policy, critic, ref_policy)
        self.accelerator = P.make_accelerator(config, policy)
        set_seed(config.seed)
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError("the policy tokenizer needs a pad token")
        self.verifier = verifier
        self.online_prms = P.online_prms(config, verifier)
        self.reward_funcs: list[WeightedReward] = build_reward_funcs(config, verifier, reward_funcs or (),
                                                                     reward_weights)
        """Every reward of the run (`rl.rewards`): --reward's, the format penalties, then the user's."""
        self.rewards = RewardPlacer(config, tokenizer, self.reward_funcs, self.accelerator.device)
        """A batch's rewards placed on its tokens (`rl.reward_table`): `rewards(batch) -> (rewards, metrics)`."""
        if not train_problems:
            raise ValueError("no training prompts")
        self.train_problems = list(train_problems)
        self.eval_problems = list(eval_problems or [])
        self.probe_problems = list(probe_problems or [])
        self.prompt_too_long = dict(prompt_too_long or {})
        """Problems of each prompt set left out before the run because their prompt does not fit the
        context (`rl.ppo_setup.check_prompt_sets`); reported in eval.json."""
        self.is_peft = hasattr(policy, "disable_adapter")
        ref_policy = P.frozen_reference(policy, ref_policy, self.accelerator, self.is_peft)
        critic = P.kept_critic(config, critic)
        self.model = PolicyAndCritic(policy, critic)
        D.match_trainable_dtype(self.model, self.accelerator)  # DeepSpeed flattens them into one buffer
        self.model, self.optimizer, self.scheduler = P.prepared(config, self.accelerator, self.model, policy, critic)
        self.ref_policy = None if ref_policy is None else P.placed_reference(ref_policy, self.accelerator)
        self.kl_ctl = (M.AdaptiveKLController(config.beta, config.kl_target, config.kl_horizon) if config.adaptive_kl
                       else M.FixedKLController(config.beta))
        self.update = 0
        self.segment_start, self.seconds_before = time.time(), 0.0
        """When this process's segment of the run began; the seconds of the segments before it."""
        self.segment_end: float | None = None  # when its updates ended: the clock stops there
        self.skipped_batches = 0
        self.stopped_early: str | None = None
        """Why this launch stopped before --max_steps: 'max_train_seconds', 'max_generated_tokens' or
        'length_drift'."""
        self.limits = RunLimits(config, self.accelerator)
        """The length-drift guard, the tokens sampled so far, and when to stop early (`rl.run_limits`)."""
        assert config.output_dir is not None, "StepPPOConfig sets a default --output_dir"
        self.out = Path(config.output_dir)
        self.run = RunDir(self.out)
        self.sampler = RolloutSampler(config, tokenizer, self.accelerator, self.model, self.train_problems, self.out,
                                      self.ref_policy)
        """The rollouts of each update, mc_values' and the progress prover's continuations (`rl.rollouts`)."""
        self.evaluator = PolicyEvaluator(config, tokenizer, self.accelerator, self.sampler, hooks, self.eval_problems,
                                         self.probe_problems, self.run)
        """Greedy evaluation and the probes (`rl.ppo_eval`)."""
        if self.accelerator.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)

    def _unwrapped_policy(self):
        return self.accelerator.unwrap_model(self.model).policy

    # ------------------------------------------------------------------------------------------
    # forward passes

    def _forward(self, model, batch: Rollouts, rows, with_values: bool):
        q_ids, q_mask = batch.query_ids[rows], batch.query_mask[rows]
        r_ids, r_mask = batch.response_ids[rows], batch.response_mask[rows]
        input_ids = torch.cat([q_ids, r_ids], dim=1)
        attention = torch.cat([q_mask.float(), r_mask], dim=1).long()
        pos = positions(attention)
        logits, values = model(input_ids=input_ids, attention_mask=attention, position_ids=pos, with_values=with_values)
        p = q_ids.shape[1]
        logits = logits[:, p - 1 : -1].float() / self.args.temperature
        logprobs = M.logprobs_from_logits(logits, r_ids)
        if values is not None:
            values = values[:, p - 1 : -1].float()
        return logits, logprobs, values

    @torch.no_grad()
    def _ref_logprobs(self, batch: Rollouts, rows) -> torch.Tensor:
        if self.ref_policy is not None:
            wrapper = PolicyAndCritic(self.ref_policy, nn.Identity())
            return self._forward(wrapper, batch, rows, with_values=False)[1]
        policy = self._unwrapped_policy()
        with policy.disable_adapter():
            wrapper = PolicyAndCritic(policy, nn.Identity())
            return self._forward(wrapper, batch, rows, with_values=False)[1]

    # ------------------------------------------------------------------------------------------
    # the update: generate, score and place rewards, log-probabilities, advantages, optimise, log

    def step(self, update: int) -> dict[str, float]:
        clock = _Clock()
        batch = clock.time("generate", self.sampler.generate, update)
        scores, reward_metrics = clock.time("reward", self.rewards, batch)
        if REWARDS[self.args.reward].progress:  # PAV: each step's progress under the prover, at its end
            scores, progress_metrics = clock.time("progress", self.sampler.progress_rewards, batch, scores)
            reward_metrics.update(progress_metrics, **{"reward/mean_total": scores.sum(-1).mean().item()})
        logps = self.logprobs(batch)
        extra = online_update(self.online_prms, batch, self.args, self.accelerator, self._all_ranks) \
            if self.online_prms else {}  # PRIME: after the rewards
        step_values = None  # mc_values: continuations sampled from every step boundary (VinePPO)
        if M.ESTIMATORS[self.args.advantage_estimator].monte_carlo:
            step_values = clock.time("mc_values", self.sampler.mc_step_values, batch, scores, self.rewards)
        adv = self.advantages(batch, scores, logps, step_values)
        extra.update(adv.stats)
        extra["rollout/tokens"] += reward_metrics.get("rollout/progress_tokens", 0.0)  # the prover's too
        if not self._all_ranks(M.is_finite_batch(adv.token_rewards, adv.advantages, adv.returns, logps.old)):
            self.skipped_batches += 1
            return {"skipped": 1.0, "skipped_batches": float(self.skipped_batches), **reward_metrics,
                    "rollout/tokens": extra["rollout/tokens"]}  # sampled all the same
        losses = clock.time("optimize", self.optimize, batch, logps, adv, update)
        kl_per_response = logps.kl.sum(-1).mean().item()
        self.kl_ctl.update(kl_per_response, batch.response_mask.shape[0] * self.accelerator.num_processes)
        out = {**losses, **reward_metrics, **extra}
        out.update({
            "objective/kl": kl_per_response,
            "objective/kl_coef": float(self.kl_ctl.value),
            "objective/non_score_reward": -(self.kl_ctl.value * logps.kl).sum(-1).mean().item(),
            "lr": self.scheduler.get_last_lr()[0],
            "skipped_batches": float(self.skipped_batches),
            **clock.seconds, "time/update": clock.total(),
            "memory/peak_gib": D.peak_memory_gib(self.accelerator.device),
        })
        return self._mean_over_ranks(out)

    @torch.no_grad()
    def logprobs(self, batch: Rollouts) -> LogProbs:
        """The rollout's log-probabilities under the policy as it sampled it and under the reference,
        the critic's values (estimators with a critic), and the per-token KL between the two."""
        mask = batch.response_mask
        rows = torch.arange(mask.shape[0], device=mask.device)
        self.model.eval()
        uses_critic = M.ESTIMATORS[self.args.advantage_estimator].uses_critic
        _, old, values = self._forward(self.model, batch, rows, with_values=uses_critic)
        ref = self._ref_logprobs(batch, rows)
        return LogProbs(old, ref, values, M.per_token_kl(old, ref, self.args.kl_estimator) * mask)

    def advantages(self, batch: Rollouts, scores: torch.Tensor, logps: LogProbs,
                   step_values: StepValues | None = None) -> Advantages:
        """The estimator's advantages and returns from the placed rewards (less the KL penalty, unless
        the estimator puts the KL in the loss), whitened where the estimator does not normalise;
        `step_values`: the Monte Carlo values of mc_values (`RolloutSampler.mc_step_values`)."""
        args, mask = self.args, batch.response_mask
        estimator = M.ESTIMATORS[args.advantage_estimator]
        token_rewards = scores if estimator.kl_in_loss else scores - self.kl_ctl.value * logps.kl
        inputs = M.AdvantageBatch(token_rewards, mask, batch.reward_mask, logps.values)
        if step_values is not None:
            inputs = replace(inputs, step_values=step_values.values, token_steps=step_values.token_steps)
        estimate = estimator.estimate(inputs, args)
        stats = {**estimate.stats, **(step_values.stats if step_values is not None else {})}
        loss_mask = mask  # the tokens the loss averages over
        if args.drop_flat_groups:  # DAPO: no flat group in the loss; the others keep their weight
            assert estimate.flat_rows is not None, "validate() allows it only where the estimator reports them"
            loss_mask = mask * (~estimate.flat_rows)[:, None].to(mask.dtype)
        stats["rollout/tokens"] = mask.sum().item() + stats.get("rollout/mc_tokens", 0.0)  # every sampled token
        advantages = estimate.advantages
        if args.whiten_advantages and not estimator.normalised:
            advantages = M.masked_whiten(advantages, mask) * mask
        return Advantages(advantages, estimate.returns, estimate.values, loss_mask, token_rewards, stats)

    def optimize(self, batch: Rollouts, logps: LogProbs, adv: Advantages, update: int) -> dict[str, float]:
        """`num_iterations` passes over the batch in `num_mini_batches` shuffled minibatches, each an
        optimizer step on the clipped policy loss (none while the critic warms up), the value loss,
        the entropy bonus and the KL loss of the estimators that keep it there; mean losses back."""
        args, n = self.args, batch.response_mask.shape[0]
        warming_up = M.ESTIMATORS[args.advantage_estimator].uses_critic and update < args.critic_warmup_updates
        policy_coef = 0.0 if warming_up else 1.0
        self.model.train()
        stats: dict[str, list[float]] = defaultdict(list)  # every minibatch's value of each
        mb_size = n // args.num_mini_batches
        gen = torch.Generator().manual_seed(args.seed * 7919 + update)
        for _ in range(args.num_iterations):
            order = torch.randperm(n, generator=gen).to(batch.response_mask.device)
            for start in range(0, n, mb_size):
                self._minibatch_step(batch, logps, adv, order[start : start + mb_size], policy_coef, stats)
        return {k: sum(v) / len(v) for k, v in stats.items()}

    def _minibatch_step(self, batch: Rollouts, logps: LogProbs, adv: Advantages, mb: torch.Tensor,
                        policy_coef: float, stats: dict[str, list[float]]) -> None:
        args, m = self.args, adv.loss_mask[mb]
        estimator = M.ESTIMATORS[args.advantage_estimator]
        logits, logprobs, values = self._forward(self.model, batch, mb, with_values=estimator.uses_critic)
        pg_loss, pg_stats = M.policy_loss(logprobs, logps.old[mb], adv.advantages[mb], m, args.epsilon)
        loss = policy_coef * pg_loss
        token_entropy = M.entropy_from_logits(logits) if args.entropy_coef else None
        if token_entropy is not None:
            loss = loss - policy_coef * args.entropy_coef * M.masked_mean(token_entropy, m)
        if estimator.kl_in_loss and self.kl_ctl.value:
            kl_loss = M.masked_mean(M.per_token_kl(logprobs, logps.ref[mb], "k3"), m)
            loss = loss + self.kl_ctl.value * kl_loss
            stats["loss/kl"].append(kl_loss.item())
        if values is not None:
            assert adv.values is not None, "an estimator that keeps a critic returns its values"
            vf_loss, vf_stats = M.value_loss(values, adv.values[mb], adv.returns[mb], m, args.cliprange_value)
            loss = loss + args.vf_coef * vf_loss
            stats["loss/value"].append(vf_loss.item())
            stats["value/clipfrac"].append(float(vf_stats["vf_clipfrac"]))
        if not self._all_ranks(bool(torch.isfinite(loss).item())):
            self.skipped_batches += 1
            self.optimizer.zero_grad()
            return
        self.accelerator.backward(loss)
        if self.accelerator.sync_gradients and args.max_grad_norm:
            self.accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        with torch.no_grad():
            entropy = M.masked_mean(token_entropy if token_entropy is not None
                                    else M.entropy_from_logits(logits), batch.response_mask[mb]).item()
        stats["loss/policy"].append(pg_loss.item())
        stats["policy/entropy"].append(entropy)
        stats["policy/clipfrac"].append(float(pg_stats["clipfrac"]))
        stats["policy/approx_kl"].append(float(pg_stats["approx_kl"]))

    @torch.no_grad()
    def _rank_fingerprints(self, module=None) -> dict[str, str]:
        """A fingerprint of each rank's policy weights (whole weights, gathered under ZeRO-3), or of
        `module`'s (an online PRM's, whole on every rank), to check the replicas stayed identical."""
        module = self._unwrapped_policy() if module is None else module
        total = torch.tensor(D.fingerprint(module, self.accelerator), dtype=torch.float64,
                             device=self.accelerator.device)
        gathered = self.accelerator.gather(total[None]).tolist()
        return {str(rank): f"{a:.17g}/{b:.17g}" for rank, (a, b) in enumerate(gathered)}

    def _all_ranks(self, ok: bool) -> bool:
        flag = torch.tensor([0.0 if ok else 1.0], device=self.accelerator.device)
        flag = self.accelerator.reduce(flag, reduction="sum")
        return flag.item() == 0

    def _mean_over_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.accelerator.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        t = torch.tensor([metrics[k] for k in keys], device=self.accelerator.device, dtype=torch.float64)
        t = self.accelerator.reduce(t, reduction="mean")
        return dict(zip(keys, t.tolist()))

    # ------------------------------------------------------------------------------------------
    # checkpoints, the loop

    def save_checkpoint(self) -> Path:
        """Accelerate state (model, optimizer, scheduler, RNG of every rank) plus ours, written whole
        under a staging name and renamed into place (`RunDir.commit_checkpoint`); beside it the policy
        as `save_pretrained` (CHECKPOINT/policy: the model, or its LoRA adapter, and the tokenizer)
        and a `transformers.TrainerState` trainer_state.json."""
        tmp = self.run.staging(self.update)
        if self.accelerator.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        self.accelerator.wait_for_everyone()
        self.accelerator.save_state(str(tmp))  # under FSDP2: the RNG states only (nothing was prepared)
        fsdp2.save(self.model, self.optimizer, self.scheduler, tmp, self.accelerator.is_main_process)
        policy_weights = self._gathered_policy_weights()  # collective under ZeRO-3
        self.accelerator.wait_for_everyone()  # every rank's files (its RNG state, its shard) are in tmp
        final = self.run.checkpoint(self.update)
        if self.accelerator.is_main_process:
            self.run.write_resume_state(tmp, {"update": self.update, "skipped_batches": self.skipped_batches,
                                              "beta": float(self.kl_ctl.value),
                                              "reward_stats": self.rewards.stats.state_dict(),
                                              "train_seconds": self.train_seconds(),
                                              **self.limits.state_dict()})
            for k, prm in enumerate(self.online_prms):
                torch.save(prm.online_state(), tmp / f"implicit_prm_{k}.pt")
            self.run.write_trainer_state(tmp, self.args, self.update)
            _save_policy(self._unwrapped_policy(), self.tokenizer, tmp / RunDir.policy, policy_weights)
            self.hooks.carry_files(self.args.model_name_or_path, tmp / RunDir.policy)
            self.run.commit_checkpoint(self.update, keep=self.args.save_total_limit)
            if self.args.push_to_hub:
                push_folder(self.args, final / RunDir.policy, f"checkpoint-{self.update}",
                            f"step PPO checkpoint at update {self.update}")
        self.accelerator.wait_for_everyone()
        return final

    def _gathered_policy_weights(self) -> dict[str, torch.Tensor] | None:
        """Under ZeRO-3 the policy's whole weights (a LoRA policy's adapter) for `save_pretrained`, on
        the main process; None elsewhere and where the weights are whole already. Collective."""
        return D.gathered_state_dict(self._unwrapped_policy(), self.accelerator, only_trainable=self.is_peft)

    def load_checkpoint(self, path: Path) -> None:
        self.accelerator.load_state(str(path))
        fsdp2.load(self.model, self.optimizer, self.scheduler, path)
        state = RunDir.resume_state(path)
        self.update = state["update"]
        self.skipped_batches = state["skipped_batches"]
        self.kl_ctl.value = state["beta"]
        self.rewards.stats.load_state_dict(state["reward_stats"])
        for k, prm in enumerate(self.online_prms):
            saved = path / f"implicit_prm_{k}.pt"
            if saved.exists():  # a checkpoint of a run without the flag has none: the PRM restarts
                prm.load_online_state(torch.load(saved, map_location=self.accelerator.device))
        # the seconds of the segments before this one (a checkpoint from before they were stored: none)
        self.seconds_before = float(state.get("train_seconds", 0.0))
        self.limits.load_state_dict(state)  # the tokens sampled and the length guard's window

    def train_seconds(self) -> float:
        """Seconds the run has trained, every resumed segment included."""
        return self.seconds_before + ((self.segment_end or time.time()) - self.segment_start)

    def train(self, resume_from_checkpoint: str | None = None) -> dict[str, Any]:
        """The run: its folder prepared (or resumed), greedy accuracy before, then updates with
        probes, logs and checkpoints, then the trained models saved and greedy accuracy after."""
        self.segment_start, self.seconds_before, self.segment_end = time.time(), 0.0, None
        resumed = self._begin(resume_from_checkpoint)
        before = self._evaluation_before(resumed)
        probing = self._first_probe(resumed)
        self.accelerator.wait_for_everyone()
        # the clock counts training (the updates and their probes) from here, as TRL's trainer.train()
        # does for the GRPO peer: the greedy evaluation before training and the first probe are not in it
        self.segment_start = time.time()
        try:
            self._updates(probing)
        except ServerError as err:  # --vllm_mode server: the server is down or answered late, on every rank
            raise self._stopped_by(err) from None
        self.segment_end = time.time()  # the final save and the greedy evaluation after are not training
        self.save_checkpoint()
        result = self._finish(before)
        self.sampler.close()  # vLLM's teardown destroys the process group: before accelerate's
        self.accelerator.end_training()
        return result

    def _stopped_by(self, err: ServerError) -> ServerError:
        """The run stopped on a failed rollout-server request: the state after the last whole update saved
        as a checkpoint (collective), the engine and trackers closed; the error to raise, its line extended."""
        self.segment_end = time.time()
        final = self.save_checkpoint()
        self.sampler.close()
        self.accelerator.end_training()
        return ServerError(f"{err}; stopped after update {self.update} of {self.args.max_steps}, saved {final} "
                           "(--resume_from_checkpoint auto continues)")

    def _begin(self, resume: str | None) -> bool:
        """The run folder prepared (refusing to mix runs; run_config.json stored) and, when resuming,
        the checkpoint loaded and the metrics past it dropped; whether it resumed."""
        if self.accelerator.is_main_process:
            prepare_run_dir(self.args, resume or "")
        self.accelerator.wait_for_everyone()
        ckpt = self.run.resume_point(resume)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
            if self.accelerator.is_main_process:
                self.run.truncate_metrics(self.update)
                print(f"[ppo_step] resuming from {ckpt} (update {self.update} of {self.args.max_steps}, "
                      f"{self.seconds_before:.1f}s trained before)", file=sys.stderr, flush=True)
        elif self.accelerator.is_main_process and self.run.metrics.exists():
            self.run.metrics.unlink()
        if self.accelerator.is_main_process:
            tracking.init_trackers(self.accelerator, self.args)
        return ckpt is not None

    def _evaluation_before(self, resumed: bool) -> dict[str, Any] | None:
        """Greedy rows before training (a resumed run's stored ones); None without evaluation problems.
        Every rank decodes its share (under ZeRO-3 generation is collective)."""
        if not self.eval_problems:
            return None
        if resumed and self.run.before_rows.exists():
            return {"rows": [json.loads(line) for line in self.run.before_rows.read_text().splitlines()]}
        before = self.evaluator.greedy_eval(desc="greedy eval before")
        if self.accelerator.is_main_process:
            write_jsonl(self.run.before_rows, before["rows"])
        return before

    def _first_probe(self, resumed: bool) -> bool:
        """The probe at update 0 (a resumed run reads which problems were wrong at its start);
        whether the run probes at all."""
        probing = bool(self.probe_problems) and self.args.probe_every > 0
        if probing and resumed and self.run.probe_wrong_at_start.exists():
            self.evaluator.probe_wrong_at_start = json.loads(self.run.probe_wrong_at_start.read_text())
        elif probing:
            first = {"update": 0, **self.evaluator.probe(self.update)}
            if self.accelerator.is_main_process:
                self.run.append_metrics({**first, "elapsed": self.seconds_before})
        return probing

    def _updates(self, probing: bool) -> None:
        """The updates left, each logged (every `logging_steps` and at each probe) and checkpointed
        (every `save_steps`)."""
        from tqdm.auto import tqdm

        args = self.args
        bar = tqdm(total=args.max_steps, initial=self.update, desc="ppo",
                   disable=not self.accelerator.is_main_process or args.disable_tqdm)
        save_every = int(args.save_steps) if args.save_steps else 0
        log_every = every_n_updates(args.logging_steps, args.max_steps)
        while self.update < args.max_steps:
            started = time.time()
            metrics = self.step(self.update)
            self.update += 1
            metrics["update"] = self.update
            self.stopped_early = self.limits.after_update(self.update, metrics, time.time() - self.segment_start,
                                                          time.time() - started)
            last = self.update == args.max_steps or self.stopped_early is not None
            probed = probing and (self.update % args.probe_every == 0 or last)
            if probed:
                metrics.update(self.evaluator.probe(self.update))
            metrics["elapsed"] = self.train_seconds()
            if self.accelerator.is_main_process and (probed or self.update % log_every == 0 or last):
                self.run.append_metrics(metrics)
                self.accelerator.log(metrics, step=self.update)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/mean_total', 0):.3f}",
                            acc=f"{metrics.get('rollout/accuracy', 0):.2f}", kl=f"{metrics.get('objective/kl', 0):.3f}")
            if save_every and self.update % save_every == 0 and not last:
                self.save_checkpoint()
            if self.stopped_early:
                break
        bar.close()

    def _finish(self, before: dict[str, Any] | None) -> dict[str, Any]:
        """The trained policy, critic and online PRMs saved (weights gathered: collective under
        ZeRO-3), greedy accuracy after against before, eval.json; the result on the main process."""
        args = self.args
        hashes = self._rank_fingerprints()
        prm_hashes = [self._rank_fingerprints(prm.model) for prm in self.online_prms]
        policy_weights = self._gathered_policy_weights()
        critic = self.accelerator.unwrap_model(self.model).critic
        critic_weights = None if critic is None else D.gathered_state_dict(
            critic, self.accelerator, only_trainable=hasattr(critic, "disable_adapter"))
        after = self.evaluator.greedy_eval(desc="greedy eval after") if before is not None else None
        result: dict[str, Any] = {}
        if self.accelerator.is_main_process:
            _save_policy(self._unwrapped_policy(), self.tokenizer, self.run.policy, policy_weights)
            self.hooks.carry_files(args.model_name_or_path, self.run.policy)  # e.g. the world's settings
            if critic is not None:
                critic.save_pretrained(str(self.run.critic), state_dict=critic_weights)
            for k, prm in enumerate(self.online_prms):  # loadable as implicit:OUTPUT_DIR/implicit_prm
                prm.save_pretrained(str(self.run.implicit_prm if k == 0 else self.out / f"{RunDir.implicit_prm}_{k}"),
                                    extra={"online_updates": self.update, "trained_from": prm.path,
                                           "rank_fingerprints": prm_hashes[k]})
            if args.push_to_hub:
                push_folder(args, self.run.policy, None, f"step PPO policy after {self.update} updates")
            result = self._result(before, after)
            self.run.eval.write_text(json.dumps(result, indent=2))
            self.run.policy_hashes.write_text(json.dumps(hashes, indent=2))
        self.accelerator.wait_for_everyone()
        return result

    def _result(self, before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
        args = self.args
        result = {"updates": self.update, "skipped_batches": self.skipped_batches, "reward": args.reward,
                  "reward_shaping": args.reward_shaping, "advantage_estimator": args.advantage_estimator,
                  "processes": self.accelerator.num_processes,
                  "responses_per_update": args.prompts_per_update * args.num_generations
                  * self.accelerator.num_processes, "train_seconds": self.train_seconds(),
                  "generated_tokens": self.limits.generated_tokens,
                  "stopped_early": self.stopped_early,
                  "prompt_too_long": self.prompt_too_long}
        if before is not None and after is not None:
            write_jsonl(self.run.after_rows, after["rows"])
            result.update(compare_greedy_rows(before["rows"], after["rows"], args.bootstrap_resamples, args.seed))
            if "summary" in after:
                result["error_mix_after"] = after["summary"].get("error_mix", {})
        return result


# ----------------------------------------------------------------------------------------------
# helpers of the loop


def every_n_updates(steps: float, total: int) -> int:
    """`logging_steps` / `save_steps` as a whole number of updates: a value below 1 is a share of
    the run (TrainingArguments' convention), 0 or less means every update."""
    if steps <= 0:
        return 1
    return max(1, math.ceil(steps * total)) if steps < 1 else int(steps)


def _save_policy(policy, tokenizer, path: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """The policy (or its LoRA adapter) and tokenizer with `save_pretrained`; `state_dict`: its
    whole weights where the module holds only a shard (ZeRO-3)."""
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(path), state_dict=state_dict)
    tokenizer.save_pretrained(str(path))
