"""Generation from a ZeRO-3 engine with its fetch hooks on and off, side by side in one run.

    python scripts/gpu_smoke_zero3.py [--hidden 64] [--layers 4] [--new_tokens 48] [--repeats 3]

DeepSpeed ZeRO-3 registers a hook before and after every submodule's forward that fetches its
shards and releases them. The trainer generates inside `rl.distributed.gathered`, where the weights
are whole already; with the DeepSpeed engine passed, that context takes the hooks off for the block
and registers them again after. This script builds a small Llama, wraps it in a real ZeRO-3 engine
(one process; the gloo backend where there is no GPU, NCCL on one), and prints, for the same greedy
generation:

- the tokens with the hooks on and off (they must be equal);
- how many hooks the engine holds before, inside and after the block (after must equal before);
- that a training step after the block still runs (a forward of partitioned weights needs the hooks)
  and moves the weights;
- seconds per generation with the hooks on and off, and their ratio.

It prints a line `SUMMARY ...` and then the figures as one JSON line (`scripts/gpu_smoke.sh` shows the
summary in its table). It exits 1 when a check fails. tests/test_gpu_smoke_zero3.py runs it on a tiny model.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hook_count(module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per setting (the best is kept)")
    args = parser.parse_args(argv)

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                       "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rl.distributed import gathered, without_shm_op

    gpu = torch.cuda.is_available()
    without_shm_op()  # no compiled shared-memory op (and its cache lock) on a CPU
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    ds_config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
                 # every matrix partitioned, however small (the trainer does the same for small models)
                 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3)))
    device = engine.device
    prompts = torch.randint(3, config.vocab_size, (args.batch, 8), device=device)

    def generate(engine_arg):
        with gathered(engine.module, accelerator, engine=engine_arg):
            inside = hook_count(engine.module)
            start = time.perf_counter()
            out = engine.module.generate(prompts, max_new_tokens=args.new_tokens, do_sample=False,
                                         min_new_tokens=args.new_tokens, pad_token_id=0)
            if gpu:
                torch.cuda.synchronize()
            return out.tolist(), time.perf_counter() - start, inside

    before = hook_count(engine.module)
    engine.module.eval()
    on = [generate(None) for _ in range(args.repeats)]
    off = [generate(engine) for _ in range(args.repeats)]
    after = hook_count(engine.module)
    engine.module.train()

    first = next(p for p in engine.module.parameters())
    with deepspeed.zero.GatheredParameters([first]):
        weight_before = first.detach().clone().float()
    batch = torch.randint(3, config.vocab_size, (args.batch, 16), device=device)
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
    with deepspeed.zero.GatheredParameters([first]):
        moved = float((first.detach().float() - weight_before).abs().max())

    t_on, t_off = min(t for _, t, _ in on), min(t for _, t, _ in off)
    result = {
        "device": "cuda" if gpu else "cpu",
        "tokens_equal": on[0][0] == off[0][0],
        "hooks_before": before, "hooks_inside_on": on[0][2], "hooks_inside_off": off[0][2], "hooks_after": after,
        "train_step_after": {"loss": round(loss.item(), 4), "max_weight_change": moved},
        "seconds_hooks_on": round(t_on, 4), "seconds_hooks_off": round(t_off, 4),
        "ratio_on_over_off": round(t_on / t_off, 2),
    }
    print(f"SUMMARY greedy generation {t_on:.3f} s with the fetch hooks on, {t_off:.3f} s off "
          f"({result['ratio_on_over_off']}x); tokens equal: {result['tokens_equal']}; hooks {before} -> "
          f"{off[0][2]} -> {after}")
    print(json.dumps(result))
    failures = []
    if not result["tokens_equal"]:
        failures.append("greedy tokens differ with the hooks off")
    if not (before > 0 and on[0][2] == before and off[0][2] < before and after == before):
        failures.append(f"hooks: {before} before, {on[0][2]} / {off[0][2]} inside (on / off), {after} after")
    if not (moved > 0 and torch.isfinite(loss)):
        failures.append("the training step after the block did not move the weights")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
