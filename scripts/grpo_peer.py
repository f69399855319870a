"""The peer run: TRL's `GRPOTrainer` with the gold reward on a world policy, on the budget of a
`rl/ppo_step.py` run, with the same greedy evaluation before and after and the same probe curve.

    python scripts/grpo_peer.py --policy outputs/sft_tiny --output_dir outputs/ppo_compare/grpo_trl_s0 \
        [--num_updates 120 --prompts_per_update 16 --samples_per_prompt 8 --num_mini_batches 4 \
         --ppo_epochs 2 --learning_rate 2e-5 --kl_coef 0.02 --temperature 1.0 --seed 0]

One update of ours (`prompts_per_update` x `samples_per_prompt` responses, `ppo_epochs` passes of
`num_mini_batches` minibatches) is one generation batch of GRPO: `generation_batch_size` = the
responses, `per_device_train_batch_size` = responses / minibatches, `num_iterations` = epochs, and
`max_steps` = updates x epochs x minibatches optimizer steps. The KL coefficient is GRPO's beta,
the clip range its epsilon. Training prompts are the world train split with the seed PPO uses
(never seen in SFT); evaluation is the world test split; the probe is the dev split.

Writes OUTPUT_DIR/{metrics.jsonl (probe rows with `update` and `rollouts`), eval.json (the keys of a
PPO run's eval.json, read by scripts/ppo_report.py), eval_before_rows.jsonl, eval_after_rows.jsonl}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--num_updates", type=int, default=120)
    p.add_argument("--prompts_per_update", type=int, default=16)
    p.add_argument("--samples_per_prompt", type=int, default=8)
    p.add_argument("--num_mini_batches", type=int, default=4)
    p.add_argument("--ppo_epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=2e-5)
    p.add_argument("--kl_coef", type=float, default=0.02)
    p.add_argument("--cliprange", type=float, default=0.2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--n_prompts", type=int, default=4000)
    p.add_argument("--n_eval", type=int, default=500)
    p.add_argument("--n_probe", type=int, default=100)
    p.add_argument("--probe_every", type=int, default=10)
    p.add_argument("--world_seed", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap_resamples", type=int, default=2000)
    args = p.parse_args(argv)
    batch = args.prompts_per_update * args.samples_per_prompt
    if min(args.num_updates, args.prompts_per_update, args.num_mini_batches, args.ppo_epochs) < 1 \
            or args.samples_per_prompt < 2 or batch % args.num_mini_batches:
        p.error("need updates, prompts, minibatches, epochs >= 1, samples_per_prompt >= 2 and "
                "prompts x samples divisible by the minibatches")
    if not (Path(args.policy) / "config.json").exists():
        p.error(f"--policy {args.policy}: no model there (config.json missing)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer

    from inference.backends.hf import HFGenerator
    from reasoning.prompts import solve_prompt
    from reasoning.types import Problem
    from reasoning.world import generate, row_to_problem, world_config_of
    from rl.evaluation import compare_greedy_rows, greedy_eval, stated_and_correct
    from rl.ppo_setup import PROMPT_SEED_OFFSET

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = world_config_of(args.policy)
    train_rows = generate("train", args.n_prompts, args.world_seed + PROMPT_SEED_OFFSET, world)
    evaluation = [row_to_problem(r) for r in generate("test", args.n_eval, args.world_seed, world)]
    probe = [row_to_problem(r) for r in generate("dev", args.n_probe, args.world_seed, world)]
    tok = AutoTokenizer.from_pretrained(args.policy)
    tok.pad_token = tok.pad_token or tok.eos_token
    if tok("x")["input_ids"] != tok("x", add_special_tokens=False)["input_ids"]:
        print("warning: the tokenizer adds special tokens; GRPO's prompts carry them, ours do not",
              file=sys.stderr)
    set_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.policy)

    def evaluate(problems: list[Problem]) -> dict:
        was = model.training
        model.eval()
        with torch.no_grad():
            result = greedy_eval(HFGenerator(model, tok, batch_size=100), problems, args.max_new_tokens)
        model.train(was)
        return result

    def gold(prompts, completions, answer, **_):
        return [float(stated_and_correct(c, Problem(id="", question="", answer=a))) for c, a in zip(completions, answer)]

    batch = args.prompts_per_update * args.samples_per_prompt
    steps_per_update = args.ppo_epochs * args.num_mini_batches
    config = GRPOConfig(
        output_dir=str(out / "trl"), learning_rate=args.learning_rate, lr_scheduler_type="constant",
        per_device_train_batch_size=batch // args.num_mini_batches, generation_batch_size=batch,
        num_generations=args.samples_per_prompt, num_iterations=args.ppo_epochs, beta=args.kl_coef,
        epsilon=args.cliprange, temperature=args.temperature, top_k=0, max_completion_length=args.max_new_tokens,
        max_steps=args.num_updates * steps_per_update, bf16=False, seed=args.seed, report_to="none",
        logging_steps=steps_per_update, save_strategy="no", disable_tqdm=True, max_grad_norm=1.0,
        gradient_accumulation_steps=1, use_cpu=not torch.cuda.is_available(),
    )
    data = Dataset.from_list([{"prompt": solve_prompt(r["question"]), "answer": r["answer"]} for r in train_rows])
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)

    class Probe(TrainerCallback):
        def __init__(self):
            self.start = time.time()

        def log(self, update: int) -> None:
            row = {"update": update, "rollouts": update * batch, "elapsed": time.time() - self.start,
                   "probe/greedy_accuracy": evaluate(probe)["summary"]["accuracy"]}
            with metrics_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step % (steps_per_update * args.probe_every) == 0:
                self.log(state.global_step // steps_per_update)

    before = evaluate(evaluation)
    _write(out / "eval_before_rows.jsonl", before["rows"])
    callback = Probe()
    callback.log(0)
    trainer = GRPOTrainer(model=model, reward_funcs=gold, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[callback])
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    after = evaluate(evaluation)
    _write(out / "eval_after_rows.jsonl", after["rows"])
    result = {"peer": "trl.GRPOTrainer", "reward": "gold", "updates": args.num_updates,
              "responses_per_update": batch, "train_seconds": round(seconds, 1),
              "seconds_per_update": round(seconds / args.num_updates, 2),
              **compare_greedy_rows(before["rows"], after["rows"], args.bootstrap_resamples, args.seed)}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
