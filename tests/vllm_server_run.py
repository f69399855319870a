"""Helper of tests/test_vllm_server.py, run in its own process:

    [accelerate launch ...] tests/vllm_server_run.py ppo CHECKS_DIR -- <rl/ppo_step.py arguments>

`rl/ppo_step.py`'s `main` with `rl.rollouts.push_to_server` wrapped: after every push (the trainer
pushes before each rollout, i.e. after every update) the server's greedy token ids on fixed prompts
are compared with transformers' greedy token ids of the policy just pushed (the trainer's own
model, LoRA and all); one JSON line per push goes to CHECKS_DIR/rank<r>.jsonl (rank 0 pushes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (str(ROOT), str(ROOT / "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from vllm_cpu_run import MAX_NEW, hf_greedy, prompt_ids  # noqa: E402


def server_logprobs(server, ids: list[list[int]]) -> list[list[float]]:
    """The log-probability the server gives each greedy token of each prompt: a push that changes
    the weights at all changes them, where the greedy tokens themselves may not move."""
    body = {"model": server._model, "prompt": ids, "max_tokens": MAX_NEW, "temperature": 0.0, "top_k": 0,
            "n": 1, "logprobs": 0}
    answer = server._call("POST", "/v1/completions", "greedy log-probabilities", body) or {}
    choices = sorted(answer.get("choices", []), key=lambda c: c.get("index", 0))
    return [list(c["logprobs"]["token_logprobs"]) for c in choices]


def run_ppo(checks_dir: str, ppo_argv: list[str]) -> int:
    import rl.rollouts as rollouts

    original = rollouts.push_to_server
    pushes = []

    def checked_push(server, policy, tok, directory):
        original(server, policy, tok, directory)
        ids = prompt_ids(tok, 4)
        got = [rollouts.with_eos(t, r, tok.eos_token_id) for t, r in server.complete_ids(ids, MAX_NEW, 0.0)]
        want = hf_greedy(policy, tok, ids)
        fingerprint = sum(float(p.detach().double().sum()) for p in policy.parameters())
        logprobs = server_logprobs(server, ids)
        pushes.append(1)
        rank = int(os.environ.get("RANK", "0"))
        line = {"rank": rank, "push": len(pushes), "equal": got == want, "server": got, "hf": want,
                "fingerprint": fingerprint, "server_logprobs": logprobs, "lora": hasattr(policy, "peft_config"),
                "files": sorted(p.name for p in Path(directory).iterdir())}
        Path(checks_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(checks_dir) / f"rank{rank}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    rollouts.push_to_server = checked_push
    from rl.ppo_step import main

    return main(ppo_argv)


if __name__ == "__main__":
    if sys.argv[1] != "ppo":
        sys.exit(f"unknown mode {sys.argv[1]!r}")
    rest = sys.argv[3:]
    sys.exit(run_ppo(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest))
