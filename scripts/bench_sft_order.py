"""SFT time by batch order: random batches against length-grouped ones, the same recipe, in one run.

    python scripts/bench_sft_order.py [--config configs/sft/long_world.yaml] [--threads 2]

Trains the recipe twice, one after the other, with `--train_sampling_strategy random` and
`group_by_length` (transformers' sampler: mega-batches of 50 batches, each sorted by length), and
prints, for each: the share of the batches' tokens that are not padding, training seconds, greedy
accuracy on the recipe's test problems, and the ratio of the seconds. Run it on an idle machine:
the two runs are timed, not interleaved.
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
sys.path.insert(0, str(ROOT))
ORDERS = ("random", "group_by_length")


def useful_share(lengths: list[int], batch_size: int, order: str, seed: int = 0) -> float:
    """Tokens that are not padding over all tokens, when each batch is padded to its longest row."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed)
    if order == "group_by_length":
        indices = get_length_grouped_indices(lengths, batch_size, generator=generator)
    else:
        indices = torch.randperm(len(lengths), generator=generator).tolist()
    real = padded = 0
    for start in range(0, len(indices) - batch_size + 1, batch_size):  # the recipe drops the ragged batch
        batch = [lengths[i] for i in indices[start:start + batch_size]]
        real += sum(batch)
        padded += max(batch) * batch_size
    return real / padded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sft/long_world.yaml")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each SFT run")
    parser.add_argument("--out", default=None, help="where the two policies go (default: a temporary folder)")
    a = parser.parse_args()

    out = Path(a.out or tempfile.mkdtemp(prefix="bench_sft_order_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    results = {}
    for order in ORDERS:
        target = out / order
        cmd = [sys.executable, "-m", "rl.sft", "--config", a.config, "--train_sampling_strategy", order,
               "--output_dir", str(target)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        results[order] = json.loads((target / "eval.json").read_text())

    # The share of padding, from the trained tokenizer and the same corpus the runs built.
    from transformers import AutoTokenizer

    from trl import TrlParser

    from rl.sft import WorldSFTArguments, WorldSFTConfig, build_corpus, generate
    args, training_args = TrlParser((WorldSFTArguments, WorldSFTConfig)).parse_args_and_config(
        args=["--config", a.config, "--output_dir", str(out / ORDERS[0])])
    rows = generate("train", args.n_train, args.world_seed, args.world_config())
    corpus = build_corpus(rows, args.task_weights(), seed=training_args.seed, teacher_noise=args.teacher_noise)
    tokenizer = AutoTokenizer.from_pretrained(str(out / ORDERS[0]))
    lengths = [len(tokenizer(r["prompt"] + r["completion"])["input_ids"]) for r in corpus]
    batch_size = training_args.per_device_train_batch_size

    print(f"\n{a.config}: {len(lengths)} rows, {sum(lengths) / len(lengths):.1f} tokens each "
          f"({min(lengths)}-{max(lengths)}), batches of {batch_size}, {a.threads} threads")
    print(f"{'order':<16} {'not padding':>11} {'train s':>8} {'greedy':>7}")
    for order in ORDERS:
        r = results[order]
        print(f"{order:<16} {useful_share(lengths, batch_size, order):>11.3f} {r['train_seconds']:>8.1f} "
              f"{r['greedy_accuracy']:>7.3f}")
    ratio = results["group_by_length"]["train_seconds"] / results["random"]["train_seconds"]
    print(f"group_by_length / random train seconds: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
