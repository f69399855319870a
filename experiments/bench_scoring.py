"""Speed of PSV scoring: one forward pass per path against one forward pass per prefix.

    python -m experiments.bench_scoring [--psv DIR] [--n_paths 240] [--batch_size 16]

Builds a tiny PSV offline (a BPE tokenizer trained on world text and a small Llama with a new
head), or loads `--psv`, takes world paths of 6-8 steps (gold paths and paths with an injected
error), and scores them (a) with `PSVVerifier.score`, every step read from one forward pass over
the whole path, and (b) prefix by prefix, scoring steps[:k] separately for every k and keeping
the last step's score, which is what a verifier that re-reads the path for each step costs. Both
ways use the same batch size and one CPU thread. Checks that they agree (max |delta| < 1e-4) and
prints one JSON line with both times and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasoning.prompts import solve_prompt  # noqa: E402
from reasoning.steps import join_steps  # noqa: E402
from reasoning.world import WorldConfig, corrupt_steps, generate  # noqa: E402
from reward_models.psv import PSVVerifier, init_psv_from_policy, load_psv_model  # noqa: E402


def build_tiny_psv(directory: str, hidden_size: int, num_layers: int, seed: int = 0) -> tuple:
    """A tiny policy saved to `directory` and a PSV initialised from it (new head)."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    rows = generate("train", 300, seed, WorldConfig(min_steps=5, max_steps=7))
    tok = train_tokenizer((solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows), vocab_size=400)
    policy = build_tiny_causal_lm(tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=4, seed=seed)
    policy.save_pretrained(directory)
    tok.save_pretrained(directory)
    return init_psv_from_policy(directory)


def world_paths(n: int, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """`n` world paths of 6-8 steps: gold ones and ones with an injected error, alternating."""
    rows = generate("test", (n + 1) // 2, seed, WorldConfig(min_steps=5, max_steps=7))
    rng = random.Random(seed)
    questions, paths = [], []
    for row in rows:
        questions.append(row["question"])
        paths.append(list(row["steps"]))
        questions.append(row["question"])
        paths.append(corrupt_steps(row, rng)[0])
    return questions[:n], paths[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--psv", default=None, help="A saved PSV; default: build a tiny one offline.")
    parser.add_argument("--n_paths", type=int, default=240, help="World paths to score (>= 200).")
    parser.add_argument("--batch_size", type=int, default=16, help="Paths per forward pass, both ways.")
    parser.add_argument("--hidden_size", type=int, default=64, help="Width of the tiny PSV.")
    parser.add_argument("--num_layers", type=int, default=2, help="Depth of the tiny PSV.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.psv:
            model, tok = load_psv_model(args.psv)
        else:
            model, tok = build_tiny_psv(tmp, args.hidden_size, args.num_layers, args.seed)
        result = bench(model.eval(), tok, args.n_paths, args.batch_size, args.seed)
    print(json.dumps(result))
    return 0 if result["agree"] else 1


def bench(model, tok, n_paths: int, batch_size: int, seed: int = 0) -> dict:
    """Time both ways of scoring `n_paths` world paths and compare their scores."""
    verifier = PSVVerifier(model, tok, batch_size=batch_size)
    questions, paths = world_paths(n_paths, seed)
    steps_per_path = [len(p) for p in paths]

    verifier.score(questions[:2], paths[:2])  # warm-up
    verifier.tokens_used = 0
    start = time.perf_counter()
    one_pass = verifier.score(questions, paths)
    one_pass_seconds = time.perf_counter() - start
    one_pass_tokens = verifier.tokens_used

    prefix_q = [q for q, p in zip(questions, paths) for _ in range(len(p))]
    prefix_p = [p[: k + 1] for p in paths for k in range(len(p))]
    verifier.tokens_used = 0
    start = time.perf_counter()
    prefix_scores = verifier.score(prefix_q, prefix_p)
    per_prefix_seconds = time.perf_counter() - start
    per_prefix, at = [], 0
    for n in steps_per_path:
        per_prefix.append([s[-1] for s in prefix_scores[at : at + n]])
        at += n

    max_diff = max(abs(a - b) for x, y in zip(one_pass, per_prefix) for a, b in zip(x, y))
    result = {
        "paths": len(paths),
        "steps": sum(steps_per_path),
        "min_steps": min(steps_per_path),
        "max_steps": max(steps_per_path),
        "batch_size": batch_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "one_pass_seconds": round(one_pass_seconds, 4),
        "per_prefix_seconds": round(per_prefix_seconds, 4),
        "ratio": round(per_prefix_seconds / one_pass_seconds, 2),
        "one_pass_tokens": one_pass_tokens,
        "per_prefix_tokens": verifier.tokens_used,
        "max_abs_diff": max_diff,
        "agree": max_diff < 1e-4,
    }
    return result


if __name__ == "__main__":
    sys.exit(main())
