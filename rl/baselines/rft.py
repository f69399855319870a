"""Rejection-sampling fine-tuning (RFT), the baseline a user would pick instead of RL: sample the
policy on training prompts, keep its own correct samples, fine-tune on them with TRL's
`SFTTrainer`, and evaluate greedy accuracy before and after on the world test split.

    python -m rl.baselines.rft --model_name_or_path outputs/sft_tiny --output_dir outputs/ppo_compare/rft_s0 \
        [--max_steps 120 --prompts_per_update 16 --num_generations 8 --accept answer|verifier \
         --verifier V --threshold 0.5 --learning_rate 2e-4 --epochs 1 --seed 0]

Its budget is a PPO run's rollouts: `max_steps` x `prompts_per_update` prompts (the first of the
PPO run's `n_prompts` training prompts) x `num_generations` samples, by default 120 x 16 x 8 =
15,360. Those flags are the PPO run's own (rl/ppo_config.py, `USES`), with its defaults but for
the learning rate (`DEFAULTS`: fine-tuning on kept samples, not a PPO step); a PPO flag it has no
use for is refused.
`--accept answer` keeps samples whose stated answer is right; `--accept verifier` keeps samples
whose every step the verifier scores at or above `--threshold` (no gold answer used), scored in
batches through `score_paths`: a sample the verifier refuses is not kept and is counted by reason
(eval.json's `unscorable`, and one stderr line), never the end of the run. Training
prompts are the world train split with the seed PPO uses. Writes OUTPUT_DIR/{eval.json (the keys of
a PPO run's eval.json), eval_before_rows.jsonl, eval_after_rows.jsonl, metrics.jsonl, policy/}.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reasoning.jsonl import write_jsonl  # noqa: E402
from reasoning.prompts import solve_prompt  # noqa: E402
from reasoning.steps import answer_correct, has_answer, split_steps  # noqa: E402
from rl.baselines.start import start_baseline  # noqa: E402
from rl.ppo_cli import parse_with_ppo_settings  # noqa: E402
from rl.ppo_config import ConfigError, StepPPOConfig  # noqa: E402
from rl.run_dir import RunDir  # noqa: E402

# The PPO settings RFT shares with a PPO run (the rest of StepPPOConfig is refused).
USES = frozenset({
    "model_name_or_path", "output_dir", "n_prompts", "max_steps", "prompts_per_update", "num_generations",
    "temperature", "max_completion_length", "verifier", "learning_rate", "n_eval", "world_seed", "seed", "num_threads",
    "bootstrap_resamples", "answer_match",
})
# Shared settings whose RFT default is its own: one supervised epoch on the kept samples takes a
# larger step than a PPO update.
DEFAULTS = {"learning_rate": 2e-4}


@dataclass
class RFTArgs:
    """RFT's own settings."""

    accept: str = field(default="answer", metadata={
        "help": "answer: keep samples whose answer is right under --answer_match (strict: a stated answer "
                "only; flexible: also a last number); verifier: keep samples whose every "
                "step --verifier scores at or above --threshold (no gold answer used).",
        "choices": ["answer", "verifier"]})
    threshold: float = field(default=0.5, metadata={"help": "--accept verifier: the lowest step score kept."})
    epochs: float = field(default=1.0, metadata={"help": "Fine-tuning passes over the kept samples."})


def parse(argv: list[str] | None) -> tuple[StepPPOConfig, RFTArgs]:
    """RFT's settings; ConfigError (one line) for a flag it does not use or a bad value."""
    return parse_with_ppo_settings(argv, RFTArgs, USES, "rl.baselines.rft",
                                   required=("model_name_or_path", "output_dir"), defaults=DEFAULTS, check=_check)


def _check(args: StepPPOConfig, own: RFTArgs) -> None:
    if n_prompts(args) > args.n_prompts:
        raise ConfigError(f"--max_steps x --prompts_per_update ({n_prompts(args)} prompts) is more than "
                          f"--n_prompts ({args.n_prompts}): lower the one or raise the other")
    if not (Path(args.model_name_or_path) / "config.json").exists():
        raise ConfigError(f"--model_name_or_path {args.model_name_or_path}: no model there (config.json missing)")
    if own.accept == "verifier":
        from reward_models.load import check_spec

        try:
            check_spec(args.verifier, args.model_name_or_path)
        except ValueError as err:
            raise ConfigError(f"--accept verifier: {err}") from None


def verifier_accepts(verifier, samples: list[tuple[str, str]], threshold: float,
                     batch_size: int = 64) -> tuple[list[bool], Counter]:
    """Which (question, completion) samples the verifier keeps: answered ones whose lowest step score
    is at least `threshold`. Scored in batches through `score_paths`, so a path the verifier refuses
    (too long for its context, say) is not kept and is counted by reason, not the end of the run."""
    from reward_models.scoring import score_paths

    answered = [i for i, (_, text) in enumerate(samples) if split_steps(text).steps and has_answer(text)]
    scored = score_paths(verifier, [samples[i][0] for i in answered],
                         [split_steps(samples[i][1]).steps for i in answered], batch_size=batch_size)
    accept = [False] * len(samples)
    for i, scores in zip(answered, scored.scores):
        accept[i] = scores is not None and min(scores) >= threshold
    return accept, scored.reasons()


def _kept_samples(train, samples, args: StepPPOConfig, own: RFTArgs) -> tuple[list[dict], int, Counter]:
    """The samples kept for fine-tuning (right answers, or what the verifier accepts), how many were
    right, and the verifier's refusals by reason (said in one line)."""
    pairs = [(problem, c.text) for problem, group in zip(train, samples) for c in group]
    correct = [answer_correct(text, problem, args.answer_match) for problem, text in pairs]
    unscorable: Counter = Counter()
    if own.accept == "verifier":
        from reward_models.load import load_verifier

        verifier = load_verifier(args.verifier, args.model_name_or_path)
        accept, unscorable = verifier_accepts(verifier, [(p.question, text) for p, text in pairs], own.threshold)
        if unscorable:
            print(f"rft: {sum(unscorable.values())} answered samples the verifier could not score, not kept: "
                  f"{dict(unscorable)}", file=sys.stderr)
    else:
        accept = correct
    kept = [{"prompt": solve_prompt(p.question), "completion": text} for (p, text), ok in zip(pairs, accept) if ok]
    return kept, sum(correct), unscorable


def _fine_tune(model, tok, kept: list[dict], args: StepPPOConfig, own: RFTArgs, run: RunDir):
    """TRL's SFTTrainer on the kept samples (cosine schedule, batch 32, nothing saved on the way);
    returns the trainer, its model back in eval mode."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    config = SFTConfig(output_dir=str(run.trl), learning_rate=args.learning_rate, num_train_epochs=own.epochs,
                       per_device_train_batch_size=32, lr_scheduler_type="cosine", warmup_steps=0.03,
                       bf16=False, report_to="none", save_strategy="no", logging_steps=50, seed=args.seed,
                       disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    trainer = SFTTrainer(model=model.train(), args=config, train_dataset=Dataset.from_list(kept), processing_class=tok)
    trainer.train()
    model.eval()
    return trainer


def n_prompts(args: StepPPOConfig) -> int:
    """Prompts RFT samples: as many as a PPO run with these settings draws."""
    return args.max_steps * args.prompts_per_update


def main(argv: list[str] | None = None) -> int:
    started = start_baseline(parse, argv)
    if started is None:
        return 2
    args, own, run = started
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from rl.greedy_accuracy import compare_greedy_rows, greedy_eval
    from rl.ppo_setup import load_problems
    from rl.problem_hooks import WORLD_HOOKS

    # the PPO run's problems: the first of its world train prompts, and the test split
    train = load_problems("world", n_prompts(args), args, "train")[0]
    test = load_problems("world", args.n_eval, args, "test")[0]
    set_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).eval()
    gen = HFGenerator(model, tok, batch_size=128)
    start = time.time()
    with torch.no_grad():
        before = greedy_eval(gen, test, args.max_completion_length)
        params = SamplingParams(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                                n=args.num_generations, seed=args.seed)
        samples = gen.generate([solve_prompt(q.question) for q in train], params)
    kept, right, unscorable = _kept_samples(train, samples, args, own)
    sample_seconds = time.time() - start
    if not kept:
        print("error: no sample was accepted; nothing to fine-tune on", file=sys.stderr)
        return 2
    trainer = _fine_tune(model, tok, kept, args, own, run)
    with torch.no_grad():
        after = greedy_eval(HFGenerator(model, tok, batch_size=128), test, args.max_completion_length)
    trainer.save_model(str(run.policy))
    tok.save_pretrained(str(run.policy))
    WORLD_HOOKS.carry_files(args.model_name_or_path, run.policy)
    write_jsonl(run.before_rows, before["rows"])
    write_jsonl(run.after_rows, after["rows"])
    run.metrics.write_text("")
    total = len(train) * args.num_generations
    result = {"baseline": f"rft-{own.accept}", "rollouts": total, "sampled_accuracy": right / total,
              "kept": len(kept), "unscorable": dict(unscorable), "updates": 1, "responses_per_update": total,
              "train_seconds": round(time.time() - start, 1), "sample_seconds": round(sample_seconds, 1),
              **compare_greedy_rows(before["rows"], after["rows"], args.bootstrap_resamples, args.seed)}
    run.eval.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
