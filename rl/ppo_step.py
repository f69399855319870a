"""Step-level PPO with a process-supervised verifier as the reward.

    steprl-ppo [--config configs/ppo/world_compare.yaml] [--reward step] [...]      # one process
    accelerate launch [--config_file configs/accelerate/ddp.yaml] rl/ppo_step.py [...]  # several

With no arguments: the arithmetic world, the tiny SFT policy (built first when absent, training seed
--sft_seed), PPO with the critic-free group estimator rewarded by the answer check against each
training prompt's gold answer, then greedy accuracy on the world test split before and after, on one
CPU process. `--reward outcome` or `--reward step` reward with a verifier instead (--verifier).
Writes OUTPUT_DIR/metrics.jsonl (one line per update), OUTPUT_DIR/eval.json, checkpoints and the
trained policy (OUTPUT_DIR/policy).
"""

import os
import sys
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # `accelerate launch rl/ppo_step.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rl.quiet_launch  # noqa: E402, F401  (first: it filters lines the libraries print when imported)

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    import json

    from rl import fsdp2
    from rl.distributed import distributed_state

    try:  # before the settings are parsed: TrainingArguments makes accelerate's process state
        fsdp2.take_over_launch()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    checked = _checked_settings(argv)
    if checked is None:
        return 2
    args, train_set, eval_set = checked
    state = distributed_state()
    import torch

    from reasoning.threads import available_cores

    torch.set_num_threads(args.num_threads or max(1, available_cores() // state.num_processes))
    sets = _problem_sets(args, state, train_set, eval_set)
    if sets is None:
        return 2
    train, train_rows, evaluation, probe, prompt_too_long = sets
    from transformers import set_seed

    from rl.ppo_setup import load_critic, load_policy, load_reference, load_verifier_for
    from rl.ppo_trainer import StepPPOTrainer
    from rl.rewards import REWARDS

    set_seed(args.seed)  # before any weight is made: LoRA matrices and a new value head come from it
    policy, tokenizer = load_policy(args)
    critic = load_critic(args, tokenizer)
    reference = load_reference(args)  # from the weights, never a copy of a (possibly partitioned) policy
    verifier = None
    if REWARDS[args.reward].verifier:
        verifier = load_verifier_for(args, train_rows, state.device)
    trainer = StepPPOTrainer(args, policy, tokenizer, critic, verifier, train, evaluation, ref_policy=reference,
                             probe_problems=probe, prompt_too_long=prompt_too_long)
    from backends.vllm_server import ServerError

    try:
        result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    except ServerError as err:  # --vllm_mode server: the trainer stopped with a checkpoint saved
        if state.is_main_process:
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    if state.is_main_process:
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
        print(wrote_line(args.output_dir))
    return 0


def _checked_settings(argv: list[str] | None):
    """(settings, training set, evaluation set), every flag, recipe, path, data and OUTPUT_DIR error
    said in one line before the first model loads (None then), in the names the user wrote; the
    deprecation lines printed once the inputs are checked too."""
    from rl.ppo_cli import parse_config
    from rl.ppo_config import ConfigError
    from rl.ppo_setup import check_inputs, check_question_sets, load_run_problems
    from rl.setting_names import Deprecations

    notes = Deprecations()
    try:
        args = parse_config(argv, notes)
        check_inputs(args)
        train_set, eval_set = load_run_problems(args)
        check_question_sets(args, {"train": train_set.problems, "eval": [] if eval_set is None else eval_set.problems})
    except ConfigError as err:
        print(f"error: {notes.in_users_words(str(err))}", file=sys.stderr)
        return None
    notes.print()
    return args, train_set, eval_set


def _problem_sets(args, state, train_set, eval_set):
    """The training, evaluation and probe problems, after the no-argument run's models are built
    (their world is the prompts' world); empty questions refused (None, said in one line), prompts
    beyond the context left out and counted. Returns (train, train_rows, evaluation, probe,
    prompt_too_long)."""
    from reasoning.problem_sets import is_world_name
    from reasoning.world import world_config_of
    from rl.build_defaults import ensure_default_models
    from rl.ppo_config import ConfigError
    from rl.ppo_setup import check_prompt_sets, describe_problem_sets, load_probe_problems, load_run_problems, log

    uses_world = is_world_name(args.dataset) or is_world_name(args.eval_dataset)
    world_checked = world_config_of(args.model_name_or_path) if uses_world else None
    ensure_default_models(args, state.is_main_process)  # the no-argument run's models, when absent
    state.wait_for_everyone()
    if uses_world and world_config_of(args.model_name_or_path) != world_checked:
        # the policy was just built: its world (world_config.json) is what the prompts come from,
        # not the default world they were checked in before it existed
        train_set, eval_set = load_run_problems(args)
    train, train_rows = train_set.problems, train_set.world_rows
    evaluation = [] if eval_set is None else eval_set.problems
    probe = load_probe_problems(args, train)
    try:
        sets, prompt_too_long = check_prompt_sets(args, {"train": train, "eval": evaluation, "probe": probe})
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    if state.is_main_process:  # what the run trains on and what its reported change is measured on
        for line in describe_problem_sets(args, sets["train"], sets["eval"]):
            log(line)
    return sets["train"], train_rows, sets["eval"], sets["probe"], prompt_too_long


def wrote_line(output_dir: str | None) -> str:
    """The run's last line: where it wrote, and what (eval.json only when it evaluated)."""
    from rl.run_dir import RunDir

    run = RunDir(output_dir or ".")
    names = [path.name for path in (run.eval, run.metrics) if path.exists()]
    folders = [f"{path.name}/" for path in (run.policy, run.critic) if path.exists()]
    return f"wrote {output_dir} ({', '.join([*names, *folders])})"


def run() -> NoReturn:
    """The command line's entry (`python rl/ppo_step.py`, `accelerate launch rl/ppo_step.py` and the
    `steprl-ppo` console script): `main()`, then an exit through rl.distributed.end_process, so that
    a rank of a multi-process launch skips the interpreter's teardown (see there). Tests call
    `main()`, which returns."""
    from rl.distributed import end_process

    end_process(main())


if __name__ == "__main__":
    run()
