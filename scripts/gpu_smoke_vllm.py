"""GPU smoke checks of vLLM against transformers on one real model (SmolLM2-135M-Instruct by default).

    python scripts/gpu_smoke_vllm.py --policy DIR [--checks generate,throughput,sync] [--n_prompts 16]

Three checks, each printing one line `RESULT <name> <PASS|FAIL|SKIP> <seconds> <detail>` that
`scripts/gpu_smoke.sh` puts in its table (names: `NAMES`):

- `generate`: greedy completions of world prompts from the `vllm` backend (`VLLMGenerator`) and the
  `hf` backend (`HFGenerator`), with and without a stop string, compared field by field (text,
  prompt tokens, completion tokens, finish reason). Passes when every prompt token count agrees and
  at least `--min_identical` (90%) of the completions are identical: two engines' kernels differ in
  the last bits, which can flip a greedy near-tie and the rest of that completion.
- `throughput`: rollout tokens per second, sampling `--samples` completions per prompt at
  temperature 1 (the PPO rollout shape) with vLLM and with HF `generate`; the detail gives both and
  their ratio. Passes when both produced tokens (a measurement, not a bar). vLLM runs eager
  (`enforce_eager`: no CUDA graphs or torch.compile, so start-up fits the smoke's budget), which
  understates its speed.
- `sync`: the PPO weight sync (`inference.backends.vllm.sync_policy`) into a colocated engine
  (`colocated_engine`): a LoRA adapter with non-zero weights is put on the policy, its merged weights
  are pushed, and vLLM's greedy completions must then match HF's greedy completions of the adapted
  policy (same 90% rule), while the engine's completions before the push match the base policy's.

The comparisons run both engines in `--dtype` (float32 by default, where greedy near-ties flip
least); the throughput check runs bfloat16, the dtype of GPU rollouts. Exit status 0 when no
check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECKS = ("generate", "throughput", "sync")
NAMES = {"generate": "vllm_vs_hf_greedy", "throughput": "rollout_tokens_per_s", "sync": "vllm_weight_sync_lora"}
"""The name each check's result line carries (and the smoke table shows)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="a saved causal LM directory (save_pretrained)")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma list of {', '.join(CHECKS)}")
    parser.add_argument("--n_prompts", type=int, default=16, help="world prompts for generate and sync")
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--throughput_prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt in the throughput check")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the generate and sync comparisons (throughput runs bfloat16)")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.25)
    parser.add_argument("--min_identical", type=float, default=0.9)
    args = parser.parse_args(argv)
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = sorted(set(args.checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    return args


def result(check: str, ok: bool | None, seconds: float, detail: str) -> bool:
    """Print the check's result line; True unless it failed."""
    status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    print(f"RESULT {check} {status} {seconds:.0f} {detail}", flush=True)
    return ok is not False


def compare(got, want, label: str) -> tuple[int, int, int]:
    """(identical, prompt token counts equal, total) over two engines' completions; prints mismatches."""
    total = identical = prompt_equal = 0
    for i, (a_row, b_row) in enumerate(zip(got, want)):
        for a, b in zip(a_row, b_row):
            total += 1
            prompt_equal += a.prompt_tokens == b.prompt_tokens
            if a == b:
                identical += 1
            else:
                print(f"mismatch [{label}] prompt {i}:\n  vllm: {a}\n  hf:   {b}", file=sys.stderr)
    return identical, prompt_equal, total


def check_generate(args, prompts, torch_dtype) -> None:
    from inference.backends.base import SamplingParams
    from inference.backends.hf import HFGenerator
    from inference.backends.vllm import VLLMGenerator

    t0 = time.time()
    runs = {"no_stop": SamplingParams(max_new_tokens=args.max_new_tokens),
            "stop": SamplingParams(max_new_tokens=args.max_new_tokens, stop=("</Step>",))}
    engine = VLLMGenerator(args.policy, dtype=args.dtype, seed=0, gpu_memory_utilization=args.gpu_memory_utilization,
                           enforce_eager=True)
    got = {name: engine.generate(prompts, params) for name, params in runs.items()}
    del engine
    hf = HFGenerator.from_pretrained(args.policy, batch_size=64, device="cuda", dtype=torch_dtype)
    want = {name: hf.generate(prompts, params) for name, params in runs.items()}
    counts = [compare(got[n], want[n], n) for n in runs]
    identical, prompt_equal, total = (sum(c[k] for c in counts) for k in range(3))
    ok = prompt_equal == total and identical >= args.min_identical * total
    return result(NAMES["generate"], ok, time.time() - t0,
           f"{identical}/{total} identical, prompt tokens equal {prompt_equal}/{total}, {args.dtype}")


def check_throughput(args, prompts, torch_dtype) -> None:
    import torch

    from inference.backends.base import SamplingParams
    from inference.backends.hf import HFGenerator
    from inference.backends.vllm import VLLMGenerator

    t_start = time.time()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.samples, seed=0)
    torch_dtype = torch.bfloat16
    engine = VLLMGenerator(args.policy, dtype="bfloat16", seed=0, gpu_memory_utilization=args.gpu_memory_utilization,
                           enforce_eager=True)
    engine.generate(prompts[:2], params)  # warm-up
    t0 = time.time()
    out = engine.generate(prompts, params)
    vllm_tps = sum(c.completion_tokens for row in out for c in row) / (time.time() - t0)
    del engine
    hf = HFGenerator.from_pretrained(args.policy, batch_size=len(prompts) * args.samples, device="cuda",
                                     dtype=torch_dtype)
    hf.generate(prompts[:2], params)
    torch.cuda.synchronize()
    t0 = time.time()
    out = hf.generate(prompts, params)
    torch.cuda.synchronize()
    hf_tps = sum(c.completion_tokens for row in out for c in row) / (time.time() - t0)
    ok = vllm_tps > 0 and hf_tps > 0
    return result(NAMES["throughput"], ok, time.time() - t_start,
           f"vllm {vllm_tps:.0f} tok/s (eager), hf generate {hf_tps:.0f} tok/s, ratio {vllm_tps / max(hf_tps, 1e-9):.1f}x "
           f"({len(prompts)} prompts x {args.samples} samples, <= {args.max_new_tokens} tokens)")


def check_sync(args, prompts, torch_dtype) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inference.backends.base import SamplingParams
    from inference.backends.hf import HFGenerator
    from inference.backends.vllm import colocated_engine, completions_from_output, save_for_vllm, sync_policy

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(args.policy)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    base = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch_dtype).to("cuda")
    torch.manual_seed(0)
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    with torch.no_grad():  # a visible but not destructive change: small adapter weights
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(0.2)
    staged = Path(args.work) / "sync_staged"
    with policy.disable_adapter():
        save_for_vllm(policy, tok, staged)  # the engine starts from the base weights
    llm = colocated_engine(str(staged), seed=0, dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                           enforce_eager=True)
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens)
    import vllm

    vparams = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)

    def engine_greedy():
        inputs = [{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts]
        return [completions_from_output(o, greedy) for o in llm.generate(inputs, vparams, use_tqdm=False)]

    def hf_greedy(model):
        gen = HFGenerator(model, tok, batch_size=64)
        return gen.generate(prompts, greedy)

    before = engine_greedy()
    with policy.disable_adapter():
        base_out = hf_greedy(policy)
    pushed = sync_policy(llm, policy)
    after = engine_greedy()
    adapted_out = hf_greedy(policy)
    same_before, _, total = compare(before, base_out, "sync: before push vs hf base")
    same_after, _, _ = compare(after, adapted_out, "sync: after push vs hf adapted")
    changed = sum(a != b for ra, rb in zip(base_out, adapted_out) for a, b in zip(ra, rb))
    ok = same_before >= args.min_identical * total and same_after >= args.min_identical * total and changed > 0
    return result(NAMES["sync"], ok, time.time() - t0,
           f"{pushed} tensors pushed; engine=hf before {same_before}/{total}, after {same_after}/{total}; "
           f"adapter changed {changed}/{total} hf completions")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tempfile

    import torch

    if not torch.cuda.is_available():
        for check in args.checks:
            result(NAMES[check], None, 0, "no GPU")
        return 0
    if importlib.util.find_spec("vllm") is None:
        for check in args.checks:
            result(NAMES[check], None, 0, "vllm not installed (pip install 'steprl[vllm]')")
        return 0
    from reasoning.prompts import solve_prompt
    from reasoning.world import generate, world_config_of

    torch_dtype = getattr(torch, args.dtype)
    rows = generate("test", max(args.n_prompts, args.throughput_prompts), 0, world_config_of(args.policy))
    prompts = [solve_prompt(r["question"]) for r in rows]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="smoke_vllm_") as work:
        args.work = work
        for check, fn in (("generate", check_generate), ("throughput", check_throughput), ("sync", check_sync)):
            if check not in args.checks:
                continue
            t0 = time.time()
            n = args.throughput_prompts if check == "throughput" else args.n_prompts
            try:
                failed += not fn(args, prompts[:n], torch_dtype)
            except Exception as err:  # noqa: BLE001 - one failed check must not hide the others
                failed += 1
                result(NAMES[check], False, time.time() - t0, f"{type(err).__name__}: {str(err)[:200]}")
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
