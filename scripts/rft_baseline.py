"""Rejection-sampling fine-tuning (RFT), the baseline a user would pick instead of RL: sample the
policy on training prompts, keep its own correct samples, fine-tune on them with TRL's
`SFTTrainer`, and evaluate greedy accuracy before and after on the world test split.

    python scripts/rft_baseline.py --policy outputs/sft_tiny --output_dir outputs/ppo_compare/rft_s0 \
        [--n_prompts 1920 --samples_per_prompt 8 --accept answer|verifier --verifier V --seed 0]

The default budget is a PPO run's rollouts (120 updates x 16 prompts x 8 samples = 15,360).
`--accept answer` keeps samples whose stated answer is right; `--accept verifier` keeps samples
whose every step the verifier scores at or above `--threshold` (no gold answer used). Training
prompts are the world train split with the seed PPO uses. Writes OUTPUT_DIR/{eval.json (the keys of
a PPO run's eval.json), eval_before_rows.jsonl, eval_after_rows.jsonl, metrics.jsonl, policy/}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--n_prompts", type=int, default=1920)
    p.add_argument("--samples_per_prompt", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--accept", choices=("answer", "verifier"), default="answer")
    p.add_argument("--verifier", default=None)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--learning_rate", type=float, default=2e-4)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--n_eval", type=int, default=500)
    p.add_argument("--world_seed", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.accept == "verifier" and not args.verifier:
        p.error("--accept verifier needs --verifier")
    if not (Path(args.policy) / "config.json").exists():
        p.error(f"--policy {args.policy}: no model there (config.json missing)")
    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import SFTConfig, SFTTrainer

    from inference.backends.base import SamplingParams
    from inference.backends.hf import HFGenerator
    from reasoning.prompts import solve_prompt
    from reasoning.steps import split_steps
    from reasoning.world import carry_world_files, generate, row_to_problem, world_config_of
    from reward_models.annotate import has_answer
    from rl.evaluation import compare_greedy_rows, greedy_eval, stated_and_correct
    from rl.ppo_setup import PROMPT_SEED_OFFSET

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = world_config_of(args.policy)
    train = [row_to_problem(r) for r in generate("train", args.n_prompts, args.world_seed + PROMPT_SEED_OFFSET, world)]
    test = [row_to_problem(r) for r in generate("test", args.n_eval, args.world_seed, world)]
    set_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy).eval()
    gen = HFGenerator(model, tok, batch_size=128)
    start = time.time()
    with torch.no_grad():
        before = greedy_eval(gen, test, args.max_new_tokens)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                n=args.samples_per_prompt, seed=args.seed)
        samples = gen.generate([solve_prompt(q.question) for q in train], params)
    kept, right = [], 0
    verifier = None
    if args.accept == "verifier":
        from reward_models.load import load_verifier

        verifier = load_verifier(args.verifier, args.policy)
    for problem, group in zip(train, samples):
        for c in group:
            correct = stated_and_correct(c.text, problem)
            right += correct
            if args.accept == "answer" and correct:
                kept.append({"prompt": solve_prompt(problem.question), "completion": c.text})
            elif args.accept == "verifier":
                steps = split_steps(c.text).steps
                if steps and has_answer(c.text) and min(verifier.score([problem.question], [steps])[0]) >= args.threshold:
                    kept.append({"prompt": solve_prompt(problem.question), "completion": c.text})
    sample_seconds = time.time() - start
    if not kept:
        print("error: no sample was accepted; nothing to fine-tune on", file=sys.stderr)
        return 2
    config = SFTConfig(output_dir=str(out / "trl"), learning_rate=args.learning_rate, num_train_epochs=args.epochs,
                       per_device_train_batch_size=32, lr_scheduler_type="cosine", warmup_steps=0.03,
                       bf16=False, report_to="none", save_strategy="no", logging_steps=50, seed=args.seed,
                       disable_tqdm=True, use_cpu=not torch.cuda.is_available())
    trainer = SFTTrainer(model=model.train(), args=config, train_dataset=Dataset.from_list(kept), processing_class=tok)
    trainer.train()
    model.eval()
    with torch.no_grad():
        after = greedy_eval(HFGenerator(model, tok, batch_size=128), test, args.max_new_tokens)
    trainer.save_model(str(out / "policy"))
    tok.save_pretrained(str(out / "policy"))
    carry_world_files(args.policy, out / "policy")
    for name, rows in (("eval_before_rows.jsonl", before["rows"]), ("eval_after_rows.jsonl", after["rows"])):
        with (out / name).open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    (out / "metrics.jsonl").write_text("")
    total = len(train) * args.samples_per_prompt
    result = {"baseline": f"rft-{args.accept}", "rollouts": total, "sampled_accuracy": right / total,
              "kept": len(kept), "updates": 1, "responses_per_update": total,
              "train_seconds": round(time.time() - start, 1), "sample_seconds": round(sample_seconds, 1),
              **compare_greedy_rows(before["rows"], after["rows"], 2000, args.seed)}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
