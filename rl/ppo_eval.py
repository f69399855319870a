"""Greedy evaluation and the learning-curve probes of a PPO run (`rl/ppo_trainer.py` calls them):
greedy accuracy on the evaluation problems before and after training, and at every probe greedy
accuracy on the probe problems and sampled accuracy on those greedy got wrong at the start. Every
rank decodes its share of the problems (under ZeRO-3 generating is collective)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any

from backends.base import SamplingParams
from backends.hf import HFGenerator
from reasoning.prompts import solve_prompt
from reasoning.steps import answer_correct
from reasoning.types import Problem
from rl.greedy_accuracy import greedy_rows, summarize_greedy_rows
from rl.ppo_config import StepPPOConfig
from rl.problem_hooks import ProblemHooks
from rl.rollouts import RolloutSampler
from rl.run_dir import RunDir


class PolicyEvaluator:
    """Greedy evaluation (`greedy_eval`) and probes (`probe`) of the policy that `sampler` samples
    from; `probe_wrong_at_start`, the probe problems greedy got wrong at the first probe, is stored
    in the run folder (`run`) so that a resumed run keeps them."""

    def __init__(self, config: StepPPOConfig, tokenizer, accelerator, sampler: RolloutSampler, hooks: ProblemHooks,
                 eval_problems: list[Problem], probe_problems: list[Problem], run: RunDir):
        self.args, self.tokenizer, self.accelerator, self.sampler = config, tokenizer, accelerator, sampler
        self.hooks, self.eval_problems, self.probe_problems, self.run = hooks, eval_problems, probe_problems, run
        self.probe_wrong_at_start: list[str] | None = None

    @contextmanager
    def generator(self):
        """An HF generator over the policy in eval mode (train mode restored after), its weights
        whole (gathered on every rank under ZeRO-3)."""
        with self.sampler.policy_for_generation() as policy:
            was_training = policy.training
            policy.eval()
            try:
                yield HFGenerator(policy, self.tokenizer, batch_size=self.args.greedy_eval_batch_size,
                                  chat_template=self.args.chat_template)
            finally:
                if was_training:
                    policy.train()

    def shard(self, items: list) -> list:
        """This rank's share of `items` (every num_processes-th, from its index)."""
        return items[self.accelerator.process_index :: self.accelerator.num_processes]

    def unshard(self, mine: list, n: int) -> list:
        """Every rank's `shard` results, back in the order of the `n` items they came from (collective)."""
        size = self.accelerator.num_processes
        if size == 1:
            return mine
        from accelerate.utils import gather_object

        shards = gather_object([mine])
        out: list = [None] * n
        for rank, shard in enumerate(shards):
            out[rank::size] = shard
        return out

    def greedy(self, gen, problems: list[Problem], desc: str | None = None) -> dict[str, Any]:
        """Greedy rows and summary of `problems`, each rank decoding its share (collective). With
        `desc`, a progress bar on the main process (stderr), advanced per generation batch: the rows
        are the same, the batches being those the generator would make of the whole share."""
        from tqdm.auto import tqdm

        mine = self.shard(problems)
        step = max(1, self.args.greedy_eval_batch_size)
        shown = desc is not None and self.accelerator.is_main_process and not self.args.disable_tqdm
        bar = tqdm(total=len(problems), desc=desc, unit="problem", disable=not shown, leave=False)
        rows: list[dict[str, Any]] = []
        for start in range(0, len(mine), step):
            rows += greedy_rows(gen, mine[start : start + step], max_new_tokens=self.args.max_completion_length,
                                hooks=self.hooks)
            # every rank decodes a share of the same size: the main rank's progress stands for all
            bar.update(min(len(problems) - bar.n, len(mine[start : start + step]) * self.accelerator.num_processes))
        bar.close()
        rows = self.unshard(rows, len(problems))
        return {"summary": summarize_greedy_rows(rows), "rows": rows}

    def greedy_eval(self, desc: str | None = None) -> dict[str, Any]:
        """Greedy accuracy on the evaluation problems; every rank takes part (collective)."""
        with self.generator() as gen:
            return self.greedy(gen, self.eval_problems, desc)

    def probe(self, update: int) -> dict[str, float]:
        """The learning curve as the run goes: greedy accuracy on the fixed probe problems, and the
        sampled accuracy (rollout temperature, `num_generations` each) on the probe problems that
        the policy got wrong greedily at the start. Sharpening raises sampled accuracy on problems
        greedy already solves; learning shows as greedy accuracy rising and as more right samples
        on the problems it started out getting wrong. `update`: the update it follows (its sampling seed)."""
        args = self.args
        with self.generator() as gen:  # every rank probes its share of the problems
            greedy = self.greedy(gen, self.probe_problems)
            out = {"probe/greedy_accuracy": greedy["summary"]["accuracy"]}
            if self.probe_wrong_at_start is None:
                self.probe_wrong_at_start = [r["id"] for r in greedy["rows"] if not r["correct"]]
                if self.accelerator.is_main_process:
                    self.run.probe_wrong_at_start.write_text(json.dumps(self.probe_wrong_at_start))
            wrong = set(self.probe_wrong_at_start)
            hard = [p for p in self.probe_problems if p.id in wrong]
            if hard:
                mine = self.shard(hard)
                params = SamplingParams(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                                        top_p=args.top_p, n=args.num_generations, seed=args.seed + update)
                completions = gen.generate([solve_prompt(p.question) for p in mine], params) if mine else []
                right = [sum(answer_correct(c.text, p, args.answer_match) for c in group)
                         for p, group in zip(mine, completions)]
                right = self.unshard(right, len(hard))
                out["probe/sampled_accuracy_wrong_at_start"] = sum(right) / (len(hard) * args.num_generations)
        return out
