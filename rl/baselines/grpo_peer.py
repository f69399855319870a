"""The peer run: TRL's `GRPOTrainer` with the gold reward on a world policy, on the budget of a
`rl/ppo_step.py` run, with the same greedy evaluation before and after and the same probe curve.

    python -m rl.baselines.grpo_peer --model_name_or_path outputs/sft_tiny \
        --output_dir outputs/ppo_compare/grpo_trl_s0 \
        [--max_steps 120 --prompts_per_update 16 --num_generations 8 --num_mini_batches 4 \
         --num_iterations 2 --learning_rate 2e-5 --beta 0.02 --temperature 1.0 --seed 0]

Its flags are the PPO run's own (rl/ppo_config.py, `USES`), with the PPO run's defaults; a PPO flag
it has no use for (the reward, the verifier, the estimator, ...) is refused.

One update of ours (`prompts_per_update` x `num_generations` responses, `num_iterations` passes of
`num_mini_batches` minibatches) is one generation batch of GRPO: `generation_batch_size` = the
responses, `per_device_train_batch_size` = responses / minibatches, `num_iterations` the same, and
GRPO's `max_steps` = our `max_steps` (updates) x epochs x minibatches optimizer steps; `beta` and
`epsilon` are GRPO's own. Earlier flag names (`--policy`, `--num_updates`, ...) work, with a
deprecation line, as for rl/ppo_step.py. Training prompts are the world train split with the seed PPO uses
(never seen in SFT); evaluation is the world test split; the probe is the dev split.

Writes OUTPUT_DIR/{metrics.jsonl (probe rows with `update` and `rollouts`), eval.json (the keys of a
PPO run's eval.json, read by scripts/ppo_report.py), eval_before_rows.jsonl, eval_after_rows.jsonl}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reasoning.jsonl import write_jsonl  # noqa: E402
from reasoning.prompts import solve_prompt  # noqa: E402
from reasoning.types import Problem  # noqa: E402
from rl.baselines.start import start_baseline  # noqa: E402
from rl.ppo_cli import parse_with_ppo_settings  # noqa: E402
from rl.ppo_config import ConfigError, StepPPOConfig  # noqa: E402
from rl.rewards import answer_check  # noqa: E402
from rl.run_dir import RunDir  # noqa: E402

# The PPO settings the peer shares with our run (the rest of StepPPOConfig is refused).
USES = frozenset({
    "model_name_or_path", "output_dir", "max_steps", "prompts_per_update", "num_generations", "num_mini_batches",
    "num_iterations", "learning_rate", "beta", "epsilon", "temperature", "max_completion_length", "n_prompts",
    "n_eval", "n_probe", "probe_every", "world_seed", "seed", "bootstrap_resamples", "num_threads",
})


def parse(argv: list[str] | None) -> tuple[StepPPOConfig, None]:
    """The peer's settings (it has none of its own); ConfigError (one line) for a flag it does not
    use or a bad value."""
    return parse_with_ppo_settings(argv, None, USES, "rl.baselines.grpo_peer",
                                   required=("model_name_or_path", "output_dir"), check=_check)


def _check(args: StepPPOConfig, _own: None) -> None:
    if args.num_generations < 2:
        raise ConfigError(f"--num_generations must be >= 2 (GRPO compares a prompt's samples), "
                          f"got {args.num_generations}")
    if not (Path(args.model_name_or_path) / "config.json").exists():
        raise ConfigError(f"--model_name_or_path {args.model_name_or_path}: no model there (config.json missing)")


def _tokenizer(path: str):
    """The policy's tokenizer, padding with its EOS where it has no pad token; a warning when it adds
    special tokens (GRPO's prompts carry them, PPO's do not)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    if tok("x")["input_ids"] != tok("x", add_special_tokens=False)["input_ids"]:
        print("warning: the tokenizer adds special tokens; GRPO's prompts carry them, ours do not",
              file=sys.stderr)
    return tok


def _grpo_config(args: StepPPOConfig, run: RunDir, batch: int, steps_per_update: int):
    """TRL's GRPOConfig with the PPO run's budget: one of our updates is `steps_per_update` of its
    optimizer steps (iterations x minibatches) over `batch` responses."""
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(run.trl), learning_rate=args.learning_rate, lr_scheduler_type="constant",
        per_device_train_batch_size=batch // args.num_mini_batches, generation_batch_size=batch,
        num_generations=args.num_generations, num_iterations=args.num_iterations, beta=args.beta,
        epsilon=args.epsilon, temperature=args.temperature, top_k=0, max_completion_length=args.max_completion_length,
        max_steps=args.max_steps * steps_per_update, bf16=False, seed=args.seed, report_to="none",
        logging_steps=steps_per_update, save_strategy="no", disable_tqdm=True, max_grad_norm=1.0,
        gradient_accumulation_steps=1, use_cpu=not torch.cuda.is_available(),
    )


def _probe_callback(probe_accuracy, metrics_path: Path, batch: int, every: int, steps_per_update: int):
    """A TrainerCallback that appends the probe's greedy accuracy to metrics.jsonl every `every`
    optimizer steps, as PPO's learning curve does (`log(update)` writes one row)."""
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        def __init__(self):
            self.start = time.time()

        def log(self, update: int) -> None:
            row = {"update": update, "rollouts": update * batch, "elapsed": time.time() - self.start,
                   "probe/greedy_accuracy": probe_accuracy()}
            with metrics_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step % every == 0:
                self.log(state.global_step // steps_per_update)

    return Probe()


def main(argv: list[str] | None = None) -> int:
    started = start_baseline(parse, argv)
    if started is None:
        return 2
    args, _, run = started
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, set_seed
    from trl import GRPOTrainer

    from backends.hf import HFGenerator
    from rl.greedy_accuracy import compare_greedy_rows, greedy_eval
    from rl.ppo_setup import load_problems

    # the PPO run's problems: world train prompts (a seed SFT never saw), test split, dev probe
    _, train_rows = load_problems("world", args.n_prompts, args, "train")
    evaluation = load_problems("world", args.n_eval, args, "test")[0]
    probe = load_problems("world", args.n_probe, args, "dev")[0]
    tok = _tokenizer(args.model_name_or_path)
    set_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)

    def evaluate(problems: list[Problem]) -> dict:
        was = model.training
        model.eval()
        with torch.no_grad():
            result = greedy_eval(HFGenerator(model, tok, batch_size=100), problems, args.max_completion_length)
        model.train(was)
        return result

    batch = args.prompts_per_update * args.num_generations
    steps_per_update = args.num_iterations * args.num_mini_batches
    config = _grpo_config(args, run, batch, steps_per_update)
    data = Dataset.from_list([{"prompt": solve_prompt(r["question"]), "answer": r["answer"]} for r in train_rows])
    run.metrics.unlink(missing_ok=True)
    before = evaluate(evaluation)
    write_jsonl(run.before_rows, before["rows"])
    callback = _probe_callback(lambda: evaluate(probe)["summary"]["accuracy"], run.metrics, batch,
                               steps_per_update * args.probe_every, steps_per_update)
    callback.log(0)
    trainer = GRPOTrainer(model=model, reward_funcs=answer_check, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[callback])
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    after = evaluate(evaluation)
    write_jsonl(run.after_rows, after["rows"])
    result = {"peer": "trl.GRPOTrainer", "reward": "gold", "updates": args.max_steps,
              "responses_per_update": batch, "train_seconds": round(seconds, 1),
              "seconds_per_update": round(seconds / args.max_steps, 2),
              **compare_greedy_rows(before["rows"], after["rows"], args.bootstrap_resamples, args.seed)}
    run.eval.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
