"""The cost of step values from continuations, side by side in one run: seconds per PPO update of
progress rewards (PAV) and Monte Carlo values (VinePPO) against the answer check's, with the
continuations sampled shared (`--continuation_sampling shared`) and separately (the earlier way).

    python -m experiments.bench_continuations --config configs/ppo/long_world.yaml [--updates 3]
        [--variants gold,progress_shared,progress_separate,mc_shared,mc_separate,progress_seg2,mc_seg2,
                    progress_separate+r32]

Every variant is a trainer built from the recipe (the same policy, prompts and seed) with its own
reward and estimator; they take their updates in turn (update 0 of each, then update 1 of each, ...),
so that the machine's load falls on all alike; the first update of each is a warm-up, untimed.
Prints seconds per update (split into generation, continuations, optimisation), its ratio to the
answer check's (the target: <= 3x for progress and mc_values) and, where `gold+loop` runs, to the
answer check decoded by the loop, tokens sampled per update
(continuations counted, a shared continuation once), generate calls, the share of distinct prefixes
and the continuations' fill (the share of their rows' decoding steps that sampled a token). The
`*_seg{k}` variants continue from at most k boundaries inside each response (--continuation_boundaries);
`NAME+rN` is NAME sampled in rounds of N new tokens (--continuation_round_tokens N), `NAME+loop` NAME
with rollouts and continuations decoded by the loop that drops rows as they end (--hf_decoding loop;
`gold+loop` is the answer check so decoded, the fair base of a `+loop` variant's ratio).
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

VARIANTS = {
    "gold": ["--reward", "gold"],
    "progress_shared": ["--reward", "gold+progress", "--continuation_sampling", "shared"],
    "progress_separate": ["--reward", "gold+progress", "--continuation_sampling", "separate"],
    "progress_sft_shared": ["--reward", "gold+progress", "--prover", "sft", "--continuation_sampling", "shared"],
    "mc_shared": ["--reward", "gold", "--advantage_estimator", "mc_values", "--continuation_sampling", "shared"],
    "mc_separate": ["--reward", "gold", "--advantage_estimator", "mc_values", "--continuation_sampling", "separate"],
}
for _k in (1, 2, 3):  # SPO's segments: continued from at most k boundaries inside each response
    VARIANTS[f"progress_seg{_k}"] = [*VARIANTS["progress_separate"], "--continuation_boundaries", str(_k)]
    VARIANTS[f"mc_seg{_k}"] = [*VARIANTS["mc_separate"], "--continuation_boundaries", str(_k)]


def flags_of(name: str) -> list[str] | None:
    """A variant's flags: VARIANTS[name], or for `NAME+rN` (a separate-sampling variant) NAME's
    sampled in rounds of N tokens (--continuation_round_tokens N), for `NAME+loop` NAME's decoded by
    the loop that drops rows as they end (--hf_decoding loop: rollouts and continuations); None for an
    unknown name."""
    base, *modifiers = name.split("+")
    if base not in VARIANTS:
        return None
    flags = list(VARIANTS[base])
    for modifier in modifiers:
        if modifier == "loop" and "shared" not in base:
            flags += ["--hf_decoding", "loop"]
        elif modifier[:1] == "r" and modifier[1:].isdigit() and "shared" not in base:
            flags += ["--continuation_round_tokens", modifier[1:]]
        else:
            return None
    return flags


def build(argv: list[str]):
    """A trainer from a command line, as `rl/ppo_step.py` builds it (no probe, no evaluation set)."""
    from transformers import set_seed

    from rl.ppo_cli import parse_config
    from rl.ppo_setup import load_critic, load_policy, load_reference, load_run_problems
    from rl.ppo_trainer import StepPPOTrainer

    args = parse_config(argv)
    train = load_run_problems(args)[0].problems
    set_seed(args.seed)
    policy, tok = load_policy(args)
    critic = load_critic(args, tok)
    return StepPPOTrainer(args, policy, tok, critic, None, train, [], ref_policy=load_reference(args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ppo/long_world.yaml", help="the PPO recipe")
    parser.add_argument("--updates", type=int, default=3, help="timed updates of each variant (after a warm-up)")
    parser.add_argument("--variants", default="gold,progress_shared,progress_separate,mc_shared,mc_separate")
    parser.add_argument("extra", nargs="*", help="flags passed to every variant (after --)")
    a = parser.parse_args()
    names = a.variants.split(",")
    unknown = [n for n in names if flags_of(n) is None]
    if unknown or "gold" not in names:
        print(f"error: --variants: {', '.join(unknown) or 'gold is needed (the ratios are to it)'}; "
              f"known: {', '.join(VARIANTS)}, each separate one also as NAME+rN and NAME+loop", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="bench_continuations_")
    common = ["--config", a.config, "--n_probe", "0", "--report_to", "none", "--disable_tqdm", "true",
              "--num_threads", "1", "--max_steps", str(a.updates + 1), *a.extra]
    trainers = {n: build([*common, "--output_dir", f"{tmp}/{n.replace('+', '_')}", *flags_of(n)]) for n in names}
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for update in range(a.updates + 1):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            metrics = trainer.step(update)
            metrics["wall"] = time.perf_counter() - start
            print(f"update {update} {name}: {metrics['wall']:.1f} s", file=sys.stderr, flush=True)
            if update:  # the first update of each is a warm-up
                rows[name].append(metrics)

    def mean(name: str, key: str) -> float:
        return sum(m.get(key, 0.0) for m in rows[name]) / len(rows[name])

    gold = mean("gold", "wall")
    looped = mean("gold+loop", "wall") if "gold+loop" in rows else float("nan")
    print(f"{'variant':<24} {'s/update':>9} {'x gold':>7} {'x g+loop':>8} {'generate':>9} {'contin.':>8} "
          f"{'optimize':>9} {'tokens':>9} {'x gold':>7} {'calls':>6} {'distinct':>9} {'fill':>5}")
    gold_tokens = mean("gold", "rollout/tokens")
    for name in names:
        cont = mean(name, "time/progress") + mean(name, "time/mc_values")
        requests = mean(name, "continuations/requests")
        distinct = mean(name, "continuations/distinct") / requests if requests else float("nan")
        wall = mean(name, "wall")
        print(f"{name:<24} {wall:9.2f} {wall / gold:7.2f} {wall / looped:8.2f} {mean(name, 'time/generate'):9.2f} "
              f"{cont:8.2f} {mean(name, 'time/optimize'):9.2f} {mean(name, 'rollout/tokens'):9.0f} "
              f"{mean(name, 'rollout/tokens') / gold_tokens:7.2f} {mean(name, 'continuations/generate_calls'):6.1f} "
              f"{distinct:9.2f} {mean(name, 'continuations/fill') if requests else float('nan'):5.2f}")
    print(f"({a.updates} timed updates each after a warm-up, taken in turn; recipe {a.config}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
