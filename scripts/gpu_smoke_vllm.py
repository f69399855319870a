"""GPU smoke check: the `vllm` backend against the `hf` backend under greedy decoding.

    python scripts/gpu_smoke_vllm.py [--policy DIR] [--n_prompts 16] [--dtype float32]

Without `--policy` it builds a tiny policy here (no Hub): a BPE tokenizer trained on world text
and a small Llama trained for `--train_steps` steps on world solutions, saved to a temporary
folder. It then generates greedily for `--n_prompts` world test prompts (`solve_prompt`) with
`VLLMGenerator` and `HFGenerator`, twice (no stop string; stop at `</Step>`), and compares the
completions field by field (text, prompt tokens, completion tokens, finish reason).

Passes when every prompt token count agrees and at least `--min_identical` (90%) of the
completions are identical: two engines' kernels differ in the last bits, which can flip a greedy
near-tie and the rest of that completion. Mismatches are printed. The last stdout line is
`PASS ...`, `FAIL ...` or `SKIP: ...` (exit 0 for PASS and SKIP, 1 for FAIL), which
`scripts/gpu_smoke.sh` reads.

vLLM is run in float32 to match hf's default; if vLLM refuses float32, both engines run in
bfloat16 instead (said on stderr and in the result line).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def build_policy(directory: str, train_steps: int, seed: int = 0, device: str = "cuda") -> None:
    """A tiny tokenizer + Llama trained briefly on world solutions (so greedy outputs are peaked)."""
    import torch

    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import generate
    from rl.models import build_tiny_causal_lm

    rows = generate("train", 4000, seed)
    texts = [solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows]
    tok = train_tokenizer(texts, vocab_size=512)
    # head_dim 64: a size every vLLM attention backend supports.
    model = build_tiny_causal_lm(tok, hidden_size=128, num_layers=2, num_heads=2, seed=seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    batch = 64
    for step in range(train_steps):
        start = (step * batch) % len(texts)
        enc = tok([t + tok.eos_token for t in texts[start : start + batch]], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(device)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"built a tiny policy: {sum(p.numel() for p in model.parameters())} parameters, {train_steps} steps, "
          f"final loss {loss.item():.3f}" if train_steps else "built an untrained tiny policy", file=sys.stderr)
    model.cpu().save_pretrained(directory)
    tok.save_pretrained(directory)


def make_vllm(policy: str, dtype: str, args):
    from inference.backends.vllm import VLLMGenerator

    return VLLMGenerator(policy, dtype=dtype, seed=0, gpu_memory_utilization=args.gpu_memory_utilization,
                         enforce_eager=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", help="a saved policy directory; default: build a tiny one here")
    parser.add_argument("--n_prompts", type=int, default=16)
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--train_steps", type=int, default=300, help="training steps of the built policy")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.3)
    parser.add_argument("--min_identical", type=float, default=0.9)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("SKIP: no GPU")
        return 0
    if importlib.util.find_spec("vllm") is None:
        print("SKIP: vllm not installed (pip install 'steprl[vllm]')")
        return 0

    from inference.backends.base import SamplingParams
    from inference.backends.hf import HFGenerator
    from reasoning.prompts import solve_prompt
    from reasoning.world import generate, world_config_of

    tmp = None
    policy = args.policy
    if policy is None:
        tmp = tempfile.TemporaryDirectory(prefix="smoke_vllm_")
        policy = tmp.name
        build_policy(policy, args.train_steps)
    rows = generate("test", args.n_prompts, 0, world_config_of(policy))
    prompts = [solve_prompt(r["question"]) for r in rows]
    runs = {"no_stop": SamplingParams(max_new_tokens=args.max_new_tokens),
            "stop": SamplingParams(max_new_tokens=args.max_new_tokens, stop=("</Step>",))}

    dtype = args.dtype
    t0 = time.time()
    try:
        vllm_gen = make_vllm(policy, dtype, args)
    except Exception as err:  # noqa: BLE001 - vLLM builds without float32 kernels say so at start-up
        if dtype != "float32":
            raise
        print(f"vLLM refused float32 ({type(err).__name__}: {str(err)[:200]}); both engines use bfloat16",
              file=sys.stderr)
        dtype = "bfloat16"
        vllm_gen = make_vllm(policy, dtype, args)
    t_start = time.time() - t0
    t0 = time.time()
    got = {name: vllm_gen.generate(prompts, params) for name, params in runs.items()}
    t_vllm = time.time() - t0
    hf_gen = HFGenerator.from_pretrained(policy, batch_size=64, device="cuda", dtype=getattr(torch, dtype))
    t0 = time.time()
    want = {name: hf_gen.generate(prompts, params) for name, params in runs.items()}
    t_hf = time.time() - t0

    total = identical = prompt_equal = 0
    for name in runs:
        for i, (a_row, b_row) in enumerate(zip(got[name], want[name])):
            for a, b in zip(a_row, b_row):
                total += 1
                prompt_equal += a.prompt_tokens == b.prompt_tokens
                if a == b:
                    identical += 1
                else:
                    print(f"mismatch [{name}] prompt {i}:\n  vllm: {a}\n  hf:   {b}")
    frac = identical / max(total, 1)
    ok = prompt_equal == total and frac >= args.min_identical
    print(f"{'PASS' if ok else 'FAIL'}  {identical}/{total} completions identical ({frac:.1%}), prompt tokens "
          f"equal {prompt_equal}/{total}, dtype {dtype}, vllm start {t_start:.0f}s gen {t_vllm:.1f}s, "
          f"hf gen {t_hf:.1f}s")
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
