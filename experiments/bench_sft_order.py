"""SFT time by batch order: random batches against orders with less padding, the same recipe, in one run.

    python -m experiments.bench_sft_order [--config configs/sft/long_world.yaml] [--threads 2]
        [--orders random,length_buckets,batch_rebalance]

Trains the recipe once per order, one after the other, and prints, for each: the share of the
batches' tokens that are not padding, training seconds, greedy accuracy on the recipe's test
problems, and the seconds' ratio to the random order's. The orders:
- `random`: the recipe's batches of 32 random rows;
- `length_buckets` (`--length_buckets true`): batches of rows of similar length, the batches in a
  random order;
- `group_by_length`: transformers' sampler, mega-batches of 50 batches each sorted from the longest
  rows to the shortest;
- `batch_rebalance`: transformers' sampler with 4 micro-batches of 8 per optimizer step, so each
  step still sees 32 random rows, cut by length into micro-batches of different sizes.
Run it on an idle machine: the runs are timed, not interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))
ORDER_FLAGS = {
    "random": ["--train_sampling_strategy", "random"],
    "length_buckets": ["--length_buckets", "true"],
    "group_by_length": ["--train_sampling_strategy", "group_by_length"],
    "batch_rebalance": ["--train_sampling_strategy", "batch_rebalance", "--per_device_train_batch_size", "8",
                        "--gradient_accumulation_steps", "4"],
}
MICRO_BATCHES = 4  # batch_rebalance's micro-batches per optimizer step (ORDER_FLAGS)


def useful_share(lengths: list[int], batch_size: int, order: str, seed: int = 0) -> float:
    """Tokens that are not padding over all tokens, when each batch is padded to its longest row.

    `batch_size` is the rows per optimizer step; batch_rebalance cuts them into MICRO_BATCHES
    micro-batches, each padded on its own."""
    import torch
    from transformers.trainer_pt_utils import BatchRebalanceSampler, get_length_grouped_indices

    from rl.sft import length_bucket_indices

    generator = torch.Generator().manual_seed(seed)
    if order == "batch_rebalance":
        batches = list(BatchRebalanceSampler(lengths, batch_size, dp_size=1, grad_accum=MICRO_BATCHES, seed=seed))
    else:
        if order == "group_by_length":
            indices = get_length_grouped_indices(lengths, batch_size, generator=generator)
        elif order == "length_buckets":
            indices = length_bucket_indices(lengths, batch_size, generator)
        elif order == "random":
            indices = torch.randperm(len(lengths), generator=generator).tolist()
        else:
            raise ValueError(f"unknown order {order!r}; known: {', '.join(ORDER_FLAGS)}")
        # the recipe drops the ragged last batch
        batches = [indices[s:s + batch_size] for s in range(0, len(indices) - batch_size + 1, batch_size)]
    real = padded = 0
    for batch in batches:
        sizes = [lengths[i] for i in batch]
        real += sum(sizes)
        padded += max(sizes) * len(sizes)
    return real / padded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sft/long_world.yaml")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each SFT run")
    parser.add_argument("--orders", default="random,length_buckets,batch_rebalance",
                        help="comma-separated, the first is the baseline of the ratios; known: "
                             f"{', '.join(ORDER_FLAGS)}")
    parser.add_argument("--out", default=None, help="where the policies go (default: a temporary folder)")
    a = parser.parse_args()
    orders = [o.strip() for o in a.orders.split(",") if o.strip()]
    unknown = [o for o in orders if o not in ORDER_FLAGS]
    if unknown or not orders:
        print(f"error: --orders: unknown order {unknown[0] if unknown else a.orders!r}; known: "
              f"{', '.join(ORDER_FLAGS)}", file=sys.stderr)
        return 2

    out = Path(a.out or tempfile.mkdtemp(prefix="bench_sft_order_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    results = {}
    for order in orders:
        target = out / order
        cmd = [sys.executable, "-m", "rl.sft", "--config", a.config, *ORDER_FLAGS[order], "--output_dir", str(target)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        results[order] = json.loads((target / "eval.json").read_text())

    # The share of padding, from the trained tokenizer and the same corpus the runs built.
    from transformers import AutoTokenizer
    from trl import TrlParser

    from rl.sft import WorldSFTArguments, WorldSFTConfig, build_corpus, generate
    args, training_args = TrlParser((WorldSFTArguments, WorldSFTConfig)).parse_args_and_config(
        args=["--config", a.config, "--output_dir", str(out / orders[0])])
    rows = generate("train", args.n_train, args.world_seed, args.world_config())
    corpus = build_corpus(rows, args.task_weights(), seed=training_args.seed, teacher_noise=args.teacher_noise)
    tokenizer = AutoTokenizer.from_pretrained(str(out / orders[0]))
    lengths = [len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) for r in corpus]
    batch_size = training_args.per_device_train_batch_size

    print(f"\n{a.config}: {len(lengths)} rows, {sum(lengths) / len(lengths):.1f} tokens each "
          f"({min(lengths)}-{max(lengths)}), batches of {batch_size}, {a.threads} threads")
    base = orders[0]
    print(f"{'order':<16} {'not padding':>11} {'train s':>8} {f'/ {base}':>9} {'greedy':>7}")
    for order in orders:
        r = results[order]
        print(f"{order:<16} {useful_share(lengths, batch_size, order):>11.3f} {r['train_seconds']:>8.1f} "
              f"{r['train_seconds'] / results[base]['train_seconds']:>9.2f} {r['greedy_accuracy']:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
