"""Greedy accuracy of every checkpoint of a PPO run: is the final policy's change a trend or noise?

    python -m rl.tools.checkpoint_curve --output_dir outputs/ppo_compare/step

Takes the run's own settings from OUTPUT_DIR/run_config.json (so the same evaluation problems;
flags given here override them, and a run from before run_config.json takes the run's flags and
`--config` as `rl/ppo_step.py` did), rebuilds the policy as training built it (LoRA included), loads the policy
weights of each `checkpoint-N` (the last one is the final policy) and decodes the evaluation
problems greedily. Each point gets its paired-bootstrap change against the run's
`eval_before_rows.jsonl` (the SFT policy on the same problems; evaluated here when the file is
absent). Prints a markdown table and writes OUTPUT_DIR/checkpoint_curve.json, and each checkpoint's
rows as OUTPUT_DIR/checkpoint_rows/update-N.jsonl, which `scripts/rl_comparison.py RUN@N` reads to
compare runs of different lengths at the same update.

Under DeepSpeed a checkpoint's policy is read from its `policy/` folder (the gathered weights);
where there is none (a LoRA run under DeepSpeed), the checkpoint is reported and skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

POLICY_PREFIX = "policy."  # PolicyAndCritic keeps the policy under this name


def checkpoint_points(out: Path) -> list[tuple[int, Path]]:
    """(update, checkpoint directory) in update order, from the run's `checkpoint-N` folders."""
    from rl.run_dir import RunDir

    return [(int(p.name.split("-")[1]), p) for p in RunDir(out).checkpoints()]


def policy_state_from_checkpoint(path: Path) -> dict:
    """The policy's weights inside an accelerate checkpoint of PolicyAndCritic."""
    from safetensors.torch import load_file

    weights = path / "model.safetensors"
    saved = path / "policy" / "model.safetensors"  # the gathered policy beside DeepSpeed's own shards
    if not weights.exists() and saved.exists():
        return load_file(str(saved))
    if not weights.exists():
        raise FileNotFoundError(f"{path}: neither model.safetensors nor policy/model.safetensors (a LoRA "
                                "checkpoint under DeepSpeed keeps only its adapter)")
    state = {k[len(POLICY_PREFIX):]: v for k, v in load_file(str(weights)).items() if k.startswith(POLICY_PREFIX)}
    if not state:
        raise ValueError(f"{weights}: no '{POLICY_PREFIX}*' weights: not a PPO checkpoint")
    return state


def load_into(policy, state: dict) -> None:
    """Load a checkpoint's policy weights; only tied output weights may be absent from it."""
    missing, unexpected = policy.load_state_dict(state, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if policy.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"checkpoint does not match the run's policy: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


USAGE = """usage: python -m rl.tools.checkpoint_curve --output_dir RUN [--num_threads N] [--n_eval N] ...

Greedy accuracy of every checkpoint-N of the PPO run in RUN, against the run's starting policy.
Only --output_dir is needed: every other setting is the run's own (RUN/run_config.json); any flag
of rl/ppo_step.py given here overrides it (python -m rl.ppo_step --help lists them).
"""


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _print_help() -> None:
    import textwrap

    from rl.ppo_cli import INHERITED_IN_USE
    from rl.ppo_config import OWN_SETTINGS

    names = " ".join(f"--{n}" for n in dict.fromkeys([*OWN_SETTINGS, *sorted(INHERITED_IN_USE)]))
    print(USAGE + "\nflags that override the run's settings:\n" + textwrap.fill(names, 100, initial_indent="  ",
                                                                          subsequent_indent="  "))


def _eval_problems(args) -> list:
    """The run's evaluation problems: its own rows held apart (split as the run split them) under
    `auto`, else the named evaluation set."""
    from rl.ppo_checks import AUTO
    from rl.ppo_setup import load_problems, load_run_problems

    if args.eval_dataset == AUTO:
        held = load_run_problems(args)[1]
        return [] if held is None else held.problems
    return load_problems(args.eval_dataset, args.n_eval, args, "test")[0]


def _curve(out: Path, policy, evaluate, before_rows: list[dict], args) -> tuple[list[dict], list[dict], float | None]:
    """Each readable checkpoint loaded into `policy` and evaluated, its rows kept in the run folder
    and compared with `before_rows`; an unreadable one skipped with its reason. Returns the curve,
    the skipped checkpoints and the accuracy before."""
    from rl.greedy_accuracy import compare_greedy_rows
    from rl.run_dir import RunDir

    curve, skipped, base = [], [], None
    for update, path in checkpoint_points(out):  # the run's last checkpoint is its final policy
        try:
            load_into(policy, policy_state_from_checkpoint(path))
        except (FileNotFoundError, ValueError) as err:
            skipped.append({"update": update, "reason": str(err)})
            print(f"skipped checkpoint-{update}: {err}", file=sys.stderr)
            continue
        rows = evaluate()
        kept = RunDir(out).update_rows(update)
        kept.parent.mkdir(exist_ok=True)
        kept.write_text("".join(json.dumps(r) + "\n" for r in rows))
        c = compare_greedy_rows(before_rows, rows, args.bootstrap_resamples, args.seed)
        curve.append({"update": update, "greedy_accuracy": c["greedy_accuracy_after"], "change": c["improvement"],
                      "ci_low": c["improvement_ci_low"], "ci_high": c["improvement_ci_high"]})
        base = c["greedy_accuracy_before"]
        print(f"checkpoint-{update}: {c['greedy_accuracy_after']:.3f}", file=sys.stderr)
    return curve, skipped, base


def main(argv: list[str] | None = None) -> int:
    from rl.ppo_cli import parse_config
    from rl.ppo_config import ConfigError
    from rl.run_dir import RunDir, with_stored_settings

    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        _print_help()
        return 0

    try:
        args = parse_config(argv)
        out = Path(args.output_dir)
        if not out.is_dir():
            raise ConfigError(f"{out} is not a run directory")
        args = with_stored_settings(args)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import torch

    from backends.hf import HFGenerator
    from rl.greedy_accuracy import greedy_eval
    from rl.ppo_setup import load_policy

    torch.set_num_threads(args.num_threads or 1)
    from reasoning.benchmarks import DatasetError

    try:
        problems = _eval_problems(args)
    except (DatasetError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not problems:
        print("error: no evaluation problems (--eval_dataset none?)", file=sys.stderr)
        return 2
    policy, tokenizer = load_policy(args)

    def evaluate() -> list[dict]:
        policy.eval()
        gen = HFGenerator(policy, tokenizer, batch_size=args.greedy_eval_batch_size, chat_template=args.chat_template)
        return greedy_eval(gen, problems, max_new_tokens=args.max_completion_length)["rows"]

    before_file = RunDir(out).before_rows
    before_rows = _read_rows(before_file) if before_file.exists() else evaluate()  # the policy as loaded
    if {p.id for p in problems} - {r["id"] for r in before_rows}:
        print(f"error: {before_file} is not about this run's evaluation problems", file=sys.stderr)
        return 2

    curve, skipped, base = _curve(out, policy, evaluate, before_rows, args)
    if not curve:
        print(f"error: no readable checkpoint-N in {out}", file=sys.stderr)
        return 2
    print(f"| update | greedy accuracy | change vs before ({base:.3f}) [95% CI] |")
    print("|---|---|---|")
    for point in curve:
        print(f"| {point['update']} | {point['greedy_accuracy']:.3f} | {point['change']:+.3f} "
              f"[{point['ci_low']:+.3f}, {point['ci_high']:+.3f}] |")
    result = {"n": len(problems), "greedy_accuracy_before": base, "curve": curve, "skipped": skipped}
    (out / "checkpoint_curve.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
