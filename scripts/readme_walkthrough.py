"""Runs every command README.md shows, in the order a reader meets them, from a fresh clone's state.

The repository's files (tracked and not ignored) are copied to a scratch folder with no outputs/,
and each command of the README's fenced bash blocks runs there with this interpreter's environment,
long jobs cut to a few steps (the flags added are printed beside each command). The policy command 1
leaves, outputs/sft_tiny, is built first at full size as command 1 builds it (~8 min on 2 cores), or
copied from `--policy DIR` (a policy that command already built); the cut SFT command writes beside it,
so that every later command meets the policy a reader has. A command that
cannot run here (the set-up itself, a Hub model, a GPU) is named with its reason. Every README
command must meet exactly one rule below, and every rule a command: a command added to the README
fails `--list` (and tests/test_readme_walkthrough.py) until this walk knows how to run or why not.

    python scripts/readme_walkthrough.py [--list] [--keep] [--dir DIR] [--policy DIR]

Prints a line per command and `N passed, N failed, N skipped`; exits 1 at the first failure with
the end of its output.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Cuts: a tiny SFT policy (the compare recipe's --quick shape), one PPO update on a few prompts.
SFT_CUT = ("--n_train 300 --n_eval 4 --max_steps 10 --per_device_train_batch_size 16 --hidden_size 48 "
           "--num_layers 1 --num_heads 2 --vocab_size 300 --max_new_tokens 48 --disable_tqdm true")
PPO_CUT = ("--max_steps 1 --prompts_per_update 4 --num_generations 2 --n_prompts 16 --n_eval 4 --n_probe 4 "
           "--max_completion_length 48 --disable_tqdm true")
BUILD_POLICY = "python -m rl.sft --output_dir outputs/sft_tiny --seed 0"  # what command 1 builds when absent
BUILD_VERIFIER_LM = f"python -m rl.sft --output_dir outputs/sft_tiny_clean --teacher_noise none {SFT_CUT}"
BREVITY = '''def brevity(prompts, completions, completion_ids, **columns):
    return [-len(ids) / 100 for ids in completion_ids]
'''
# Placeholders of the README's usage lines, as a reader fills them in after the quick start.
PLACEHOLDERS = {"D": "outputs/sft_tiny", "POLICY": "outputs/sft_tiny", "P": "outputs/sft_tiny",
                "V": "outputs/psv_readme", "PRM": "outputs/prm_readme"}


@dataclass
class Rule:
    pattern: str  # a regular expression searched in the command
    cut: str = ""  # flags added at the end (a later flag wins)
    before: tuple[str, ...] = ()  # commands run first when their output is absent: (path, command) pairs joined by "="
    skip: str = ""  # the reason a command is not run
    serve: bool = False  # a server: started, asked for /health, stopped


RULES = [
    Rule(r"^bash scripts/setup_env\.sh$", skip="the set-up: this walk runs in the .venv it made "
         "(scripts/check_fresh_install.sh runs it from a fresh clone)"),
    Rule(r"^\.venv/bin/steprl-ppo$", cut=PPO_CUT,
         before=(f"outputs/sft_tiny={BUILD_POLICY}",)),
    Rule(r"^bash scripts/test\.sh$", skip="the test suite itself"),
    Rule(r"^pip install ", skip="the set-up by hand (scripts/check_fresh_install.sh runs the set-up)"),
    Rule(r"^python -m reasoning\.world "),
    Rule(r"^python -m rl\.sft ", cut=f"{SFT_CUT} --output_dir outputs/sft_walk"),
    Rule(r"^python -m reward_models\.annotate ", cut="--n 3"),
    Rule(r"^python -m reward_models\.train ", cut="--max_steps 2"),
    Rule(r"^python -m reward_models\.implicit_prm ", cut="--max_steps 2"),
    Rule(r"^python -m reward_models\.verifier_metrics ", cut="--limit 8 --calibrate_limit 32"),
    Rule(r"^accelerate launch rl/ppo_step\.py --reward step ", cut=PPO_CUT,
         before=(f"outputs/sft_tiny={BUILD_POLICY}", f"outputs/sft_tiny_clean={BUILD_VERIFIER_LM}")),
    Rule(r"^accelerate launch rl/ppo_step\.py --reward gold --reward_funcs my_rewards\.py", cut=PPO_CUT,
         before=(f"outputs/sft_tiny={BUILD_POLICY}",)),
    Rule(r"--model_name_or_path Qwen/", skip="a Hub model and data set (no Hub here); "
         "tests/test_docs_commands.py checks its flags"),
    Rule(r"^python -m inference\.evaluate ", cut="--limit 4"),
    Rule(r"^python scripts/compare\.py --out ", skip="one to two hours on 2 cores; the --quick line runs every stage"),
    Rule(r"^python scripts/compare\.py --quick ", cut="--n_problems 2"),
    Rule(r"^python -m backends\.serve ", serve=True),
    Rule(r"^python -m rl\.tools\.gguf_convert "),
    Rule(r"--config_file configs/accelerate/zero2\.yaml", skip="a GPU recipe (a 1.5B policy and a 7B PRM from the "
         "Hub); tests/test_launchers.py runs its files on 2 CPU processes"),
]


def readme_commands(text: str) -> list[tuple[int, str]]:
    """(line, command) of each fenced bash block's commands, continuations joined, comments dropped,
    `A && B` as two commands."""
    out, in_block, bash, pending, start = [], False, False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block, bash = (False, False) if in_block else (True, stripped[3:].strip() in ("bash", "sh"))
            continue
        if not (in_block and bash) or (stripped.startswith("#") and not pending):
            continue
        start = start if pending else number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        command = re.sub(r"\s+#\s.*$", "", pending + stripped)
        pending = ""
        out.extend((start, " ".join(part.split())) for part in command.split(" && ") if part.strip())
    return out


def instantiate(command: str) -> str:
    """A usage line as a reader runs it: optional [groups] left out, the first of {a,b}, placeholders filled."""
    command = re.sub(r"\s*\[[^\]]*\]", "", command)
    command = re.sub(r"\{([^,}]+)(,[^}]*)?\}", r"\1", command)
    return " ".join(PLACEHOLDERS.get(word, word) for word in command.split())


def plan(text: str) -> list[tuple[int, str, Rule]]:
    """Each README command with its one rule; a command with none or several, or a rule with no
    command, is an error naming it."""
    steps, used, errors = [], set(), []
    for line, command in readme_commands(text):
        rules = [i for i, rule in enumerate(RULES) if re.search(rule.pattern, command)]
        if len(rules) != 1:
            errors.append(f"README.md:{line}: {command!r} meets {len(rules)} rules of the walk, not one")
            continue
        used.add(rules[0])
        steps.append((line, command, RULES[rules[0]]))
    errors += [f"rule {RULES[i].pattern!r} meets no README command" for i in range(len(RULES)) if i not in used]
    if errors:
        raise SystemExit("readme_walkthrough: " + "\n".join(errors))
    return steps


def shell_words(command: str) -> str:
    """The command with the toolkit's interpreter and accelerate for `python` and `accelerate`."""
    words = command.split()
    swap = {"python": str(BIN / "python"), "python3": str(BIN / "python"), "accelerate": str(BIN / "accelerate"),
            ".venv/bin/python": str(BIN / "python"), ".venv/bin/accelerate": str(BIN / "accelerate"),
            ".venv/bin/steprl-ppo": str(BIN / "steprl-ppo")}
    return " ".join(swap.get(w, w) for w in words)


def run(command: str, cwd: Path, env: dict, log: Path) -> tuple[int, float]:
    start = time.time()
    with log.open("a") as out:
        out.write(f"$ {command}\n")
        out.flush()
        code = subprocess.run(shell_words(command), shell=True, cwd=cwd, env=env, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    return code, time.time() - start


def serve(command: str, cwd: Path, env: dict, log: Path) -> tuple[int, float]:
    """Starts the server on a free port, waits for /health (2 minutes at most), stops it."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = re.sub(r"--port \d+", f"--port {port}", command)
    start = time.time()
    with log.open("a") as out:
        out.write(f"$ {command}\n")
        out.flush()
        server = subprocess.Popen(shell_words(command).split(), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while time.time() - start < 120 and server.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        return 0, time.time() - start
                except httpx.HTTPError:
                    time.sleep(1)
            return 1, time.time() - start
        finally:
            server.terminate()
            server.wait(timeout=30)


def walk(work: Path, policy: Path | None = None) -> int:
    steps = plan((ROOT / "README.md").read_text())
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    (work / "my_rewards.py").write_text(BREVITY)
    if policy is not None:
        shutil.copytree(policy, work / "outputs" / "sft_tiny")
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(work), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("ACCELERATE_USE_CPU", None)
    log, counts = work / "walkthrough.log", {"passed": 0, "failed": 0, "skipped": 0}
    print(f"readme_walkthrough: {len(steps)} README commands, run in {work} (log {log})", flush=True)
    for line, command, rule in steps:
        if rule.skip:
            counts["skipped"] += 1
            print(f"  README.md:{line} skipped: {command}  ({rule.skip})", flush=True)
            continue
        for pair in rule.before:
            path, first = pair.split("=", 1)
            if not (work / path).exists() and run(first, work, env, log)[0]:
                print(f"  README.md:{line} FAILED building {path} first: {first}", flush=True)
                return 1
        full = instantiate(command) + (f" {rule.cut}" if rule.cut else "")
        code, seconds = (serve if rule.serve else run)(full, work, env, log)
        counts["passed" if code == 0 else "failed"] += 1
        print(f"  README.md:{line} {'ran' if code == 0 else 'FAILED'} in {seconds:.0f} s: {full}", flush=True)
        if code:
            print("".join(log.read_text().splitlines(keepends=True)[-25:]), file=sys.stderr)
            break
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="Print each command and what the walk does with it.")
    parser.add_argument("--keep", action="store_true", help="Leave the scratch folder.")
    parser.add_argument("--dir", default=None, help="The scratch folder (default: a new one).")
    parser.add_argument("--policy", default=None, help="A policy command 1 built (outputs/sft_tiny of a run), "
                        "copied in instead of building it first (~8 min).")
    args = parser.parse_args(argv)
    policy = Path(args.policy).resolve() if args.policy else None
    if policy is not None and not (policy / "config.json").is_file():
        print(f"readme_walkthrough: --policy {args.policy}: no such model directory (no config.json)", file=sys.stderr)
        return 2
    if args.list:
        for line, command, rule in plan((ROOT / "README.md").read_text()):
            what = f"skip ({rule.skip})" if rule.skip else f"run: {instantiate(command)} {rule.cut}".rstrip()
            print(f"README.md:{line} {what}")
        return 0
    work = Path(args.dir or tempfile.mkdtemp(prefix="steprl-readme."))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return walk(work, policy)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
