"""The cost of step scoring: time per PPO update of step-PPO over outcome-PPO, in one run.

    python -m experiments.bench_ppo_reward [--model_name_or_path outputs/sft_tiny] [--verifier outputs/psv_tiny]
        [--updates 6]

Both trainers start from the same policy, critic and seed and alternate updates (step, outcome,
step, ...), so machine noise hits both alike. Prints seconds per update for each, split into
generation, reward and optimisation, and the ratio step / outcome (target <= 1.15).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_name_or_path", default="outputs/sft_tiny", help="the policy")
    parser.add_argument("--verifier", default="outputs/psv_tiny")
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--prompts_per_update", type=int, default=32)
    parser.add_argument("--num_generations", type=int, default=2)
    a = parser.parse_args()

    from rl.ppo_config import StepPPOConfig
    from rl.ppo_setup import load_critic, load_policy, load_problems, load_verifier_for
    from rl.ppo_trainer import StepPPOTrainer

    trainers = {}
    tmp = tempfile.mkdtemp(prefix="bench_ppo_")
    for reward in ("step", "outcome"):
        args = StepPPOConfig(output_dir=f"{tmp}/{reward}", model_name_or_path=a.model_name_or_path,
                             verifier=a.verifier, reward=reward, build_missing=False,
                             prompts_per_update=a.prompts_per_update,
                             num_generations=a.num_generations, report_to="none", disable_tqdm=True)
        train, rows = load_problems("world", args.n_prompts, args, "train")
        policy, tok = load_policy(args)
        critic = load_critic(args, tok)
        verifier = load_verifier_for(args, rows, "cpu")
        trainers[reward] = StepPPOTrainer(args, policy, tok, critic, verifier, train, [])
    times = {r: {"update": [], "generate": [], "reward": [], "optimize": []} for r in trainers}
    for update in range(a.updates + 1):
        for reward, trainer in trainers.items():
            t = time.perf_counter()
            m = trainer.step(update)
            if update == 0:
                continue  # warm-up
            times[reward]["update"].append(time.perf_counter() - t)
            for part in ("generate", "reward", "optimize"):
                times[reward][part].append(m[f"time/{part}"])

    def mean(xs):
        return sum(xs) / len(xs)

    print(f"{'reward':<9} {'s/update':>9} {'generate':>9} {'reward':>9} {'optimize':>9}")
    for reward, t in times.items():
        print(f"{reward:<9} {mean(t['update']):9.3f} {mean(t['generate']):9.3f} {mean(t['reward']):9.3f} "
              f"{mean(t['optimize']):9.3f}")
    ratio = mean(times["step"]["update"]) / mean(times["outcome"]["update"])
    reward_ratio = mean(times["step"]["reward"]) / mean(times["outcome"]["reward"])
    print(f"step/outcome time per update: {ratio:.3f}x (target <= 1.15); reward computation alone: {reward_ratio:.3f}x")
    print(f"({a.updates} timed updates each, {a.prompts_per_update}x{a.num_generations} responses per update)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
