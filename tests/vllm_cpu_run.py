"""Helper of tests/test_vllm_cpu.py, run in its own process (a vLLM engine is not built inside pytest).

    python tests/vllm_cpu_run.py sync OUT_JSON POLICY_DIR
    [accelerate launch ...] tests/vllm_cpu_run.py ppo CHECKS_DIR -- <rl/ppo_step.py arguments>

`sync`: a colocated engine (float32) is started from POLICY_DIR; the policy is then changed (full
weights moved, a LoRA adapter with non-zero B, an untied copy) and pushed with `sync_policy`; after
each push vLLM's greedy token ids and transformers' greedy token ids of the same policy are written
to OUT_JSON, with the engine's greedy ids before the push (so a push that did nothing shows).

`ppo`: `rl/ppo_step.py`'s `main` with `backends.vllm.sync_policy` wrapped: after every push
(the trainer pushes before each rollout, i.e. after every update) the engine's greedy ids on fixed
prompts are compared with transformers' greedy ids of the policy just pushed; one JSON line per push
goes to CHECKS_DIR/rank<r>.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MAX_NEW = 24


def prompt_ids(tok, n=6):
    from reasoning.prompts import solve_prompt
    from reasoning.world import WorldConfig, generate

    rows = generate("test", n, 0, WorldConfig(min_steps=1, max_steps=2))
    return [tok.encode(solve_prompt(r["question"]), add_special_tokens=False) for r in rows]


def vllm_greedy(llm, ids):
    import vllm

    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_greedy(policy, tok, ids):
    import torch

    was_training = policy.training
    policy.eval()
    device = next(policy.parameters()).device
    out = []
    with torch.no_grad():
        for i in ids:  # one prompt at a time: no padding
            gen = policy.generate(input_ids=torch.tensor([i], device=device),
                                  attention_mask=torch.ones(1, len(i), dtype=torch.long, device=device),
                                  max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id)
            out.append(gen[0, len(i):].tolist())
    if was_training:
        policy.train()
    return out


def run_sync(out_json: str, policy_dir: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.vllm import colocated_engine, save_for_vllm, sync_policy

    tok = AutoTokenizer.from_pretrained(policy_dir)
    ids = prompt_ids(tok)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    llm = colocated_engine(policy_dir, dtype="float32", enforce_eager=True, max_model_len=512)
    results = {"start": {"vllm": vllm_greedy(llm, ids), "hf": hf_greedy(policy, tok, ids)}}

    def push(name, model):
        before = vllm_greedy(llm, ids)
        pushed = sync_policy(llm, model)
        results[name] = {"before": before, "vllm": vllm_greedy(llm, ids), "hf": hf_greedy(model, tok, ids),
                         "pushed": pushed}

    torch.manual_seed(1)
    with torch.no_grad():  # full fine-tuning: every weight moves (the tied embedding and head too)
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    push("full", policy)
    torch.manual_seed(2)
    lora = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    push("lora", lora)  # base + delta of every adapted layer, base names
    lora = lora.unload()
    # the staged-directory path the trainer uses: an untied head started from its own copy
    untied_dir = Path(out_json).with_suffix("") / "untied"
    untied = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32, tie_word_embeddings=False).eval()
    with torch.no_grad():
        untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    save_for_vllm(untied, tok, untied_dir)
    del llm
    llm = colocated_engine(str(untied_dir), dtype="float32", enforce_eager=True, max_model_len=512)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in untied.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    push("untied_full", untied)
    Path(out_json).write_text(json.dumps(results))


def run_ppo(checks_dir: str, ppo_argv: list[str]) -> int:
    import torch

    import backends.vllm as backend

    original = backend.sync_policy
    pushes = []

    def checked_sync(llm, policy):
        n = original(llm, policy)
        tok = checked_sync.tok
        ids = prompt_ids(tok, 4)
        got, want = vllm_greedy(llm, ids), hf_greedy(policy, tok, ids)
        rank = int(os.environ.get("RANK", "0"))
        fingerprint = sum(float(p.detach().double().sum()) for p in policy.parameters())
        pushes.append(1)
        line = {"rank": rank, "push": len(pushes), "tensors": n, "equal": got == want, "vllm": got, "hf": want,
                "fingerprint": fingerprint, "torch_threads": torch.get_num_threads()}
        Path(checks_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(checks_dir) / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        return n

    backend.sync_policy = checked_sync
    from transformers import AutoTokenizer

    policy_dir = ppo_argv[ppo_argv.index("--model_name_or_path") + 1]
    checked_sync.tok = AutoTokenizer.from_pretrained(policy_dir)
    from rl.ppo_step import main

    return main(ppo_argv)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "sync":
        run_sync(sys.argv[2], sys.argv[3])
    elif mode == "ppo":
        rest = sys.argv[3:]
        sys.exit(run_ppo(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest))
    else:
        sys.exit(f"unknown mode {mode!r}")
