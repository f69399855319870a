"""Rules on `StepPPOConfig`'s settings that take more than a line (`StepPPOConfig.validate` runs them):
the credit form a step reward gets by default, the evaluation set of --eval_dataset auto, what
--advantage_estimator mc_values, the progress rewards and --verifier_online_update need, and the
length-drift guard's settings."""

from __future__ import annotations

from reasoning.problem_sets import is_world_name
from reward_models.load import judges_each_step, kinds_of
from rl.decoding import HF_DECODING
from rl.ppo_math import ESTIMATORS, REWARD_SCALES
from rl.progress import PROVERS
from rl.rewards import REWARDS, check_no_added_rewards

AUTO = "auto"
"""The default of --reward_shaping and --step_credit: resolved by the reward mode (`resolve_credit_form`)."""

STEP_REWARD_FORM = ("delta", "own")
"""(--reward_shaping, --step_credit) of `--reward step` and `step+gold` by default, for a verifier
whose score is a value (a PSV, a published PRM, the step checker): each step paid the change of the
verifier's score across it, and each token credited with its own step's normalised reward alone. The
form docs/results/when_step_rewards_pay.md ranks best of the step credits with three seeds on both
settings, and not gamed by length on either (paired against the answer check: -0.006 [-0.022,
+0.010] on 2-4-step solutions, +0.005 [-0.011, +0.021] on 5-8-step ones; steps per response held);
DeepSeekMath's raw/return lost 5 points on both by cutting responses short."""

JUDGED_STEP_FORM = ("raw", "return")
"""(--reward_shaping, --step_credit) of `--reward step` and `step+gold` by default for a verifier that
judges each step on its own (`step-likelihood`, `step-confidence`: `reward_models.load.judges_each_step`),
the default verifier among them: each step paid its score, a token credited with the sum of the
normalised scores from its step on. A change of such a score is no change of value: with the default
verifier on the default setting delta/own lost -0.037 [-0.057, -0.019] and min/return -0.039, where
raw/return gained +0.037 [+0.017, +0.056], and on the long setting raw/return gained +0.035 [+0.017,
+0.053]; steps per response held in each (three seeds each, docs/results/when_step_rewards_pay.md,
"--reward step with no other flag"). Beside the answer check (`step+gold`) the same: delta/own
-0.010 [-0.031, +0.011], raw/return +0.069 [+0.043, +0.094] on the default setting."""

OTHER_FORM = ("raw", "return")
"""(--reward_shaping, --step_credit) of every other reward mode by default: the outcome and gold
rewards are one reward per response, so the credit form changes nothing there."""


PROGRESS_FORM = ("raw", "own")
"""(--reward_shaping, --step_credit) of `--reward progress` and `gold+progress` by default: a step's
progress is already a change of value across it (the prover's, as 'delta' is the verifier's), so it is
credited to its own tokens as step+gold's delta is (`STEP_REWARD_FORM`; PAV pays each step its own
progress); the shaping touches verifier scores only."""


def resolve_credit_form(config) -> None:
    """--reward_shaping and --step_credit left at 'auto' set from --reward: `STEP_REWARD_FORM` for a
    reward that pays the verifier's score at every step (`JUDGED_STEP_FORM` for one whose verifier
    judges each step on its own), `PROGRESS_FORM` for progress rewards, `OTHER_FORM`
    otherwise. A value given is kept."""
    mode = REWARDS[config.reward] if config.reward in REWARDS else None
    shaping, credit = STEP_REWARD_FORM if mode is not None and mode.verifier and mode.steps else OTHER_FORM
    if mode is not None and mode.verifier and mode.steps and judges_each_step(config.verifier):
        shaping, credit = JUDGED_STEP_FORM
    if mode is not None and mode.progress:
        shaping, credit = PROGRESS_FORM
    if config.reward_shaping == AUTO:
        config.reward_shaping = shaping
    if config.step_credit == AUTO:
        config.step_credit = credit


def resolve_eval_dataset(config) -> None:
    """--eval_dataset 'auto' set to 'world' when the prompts are the world's (its test split is the
    measure); with the user's own --dataset it stays 'auto': the last rows of that data, held apart
    from training (`reasoning.problem_sets.hold_apart`, read in rl/ppo_setup.py)."""
    if config.eval_dataset == AUTO and is_world_name(config.dataset):
        config.eval_dataset = "world"


def check_mc_values(config) -> None:
    """Settings that --advantage_estimator mc_values cannot use (its values are mean answer-check
    rewards of sampled continuations, graded as the gold reward grades a response)."""
    if config.mc_rollouts < 1:
        raise ValueError(f"--mc_rollouts must be >= 1, got {config.mc_rollouts}")
    mode = REWARDS[config.reward]
    if mode.verifier or mode.progress or not mode.gold:  # the answer check alone
        raise ValueError("--advantage_estimator mc_values grades its continuations with the answer check: it "
                         f"needs --reward gold, got {config.reward!r}")
    check_no_added_rewards(config.advantage_estimator, len(config.reward_funcs or []), "--reward_funcs")
    if config.gamma != 1:
        raise ValueError("--advantage_estimator mc_values estimates undiscounted values (--gamma 1), got "
                         f"--gamma {config.gamma}")
    if config.reward_normalize:
        raise ValueError("--reward_normalize does not apply to --advantage_estimator mc_values (its values are "
                         "mean rewards of continuations; --whiten_advantages scales the advantages)")
    if config.use_vllm:
        raise ValueError("--advantage_estimator mc_values samples its continuations with --use_vllm false only, "
                         "got --use_vllm true")


def check_progress(config) -> None:
    """Settings a progress reward (--reward progress, gold+progress) needs; its own settings refused
    under any other reward, where they would do nothing."""
    if config.prover not in PROVERS:
        raise ValueError(f"--prover must be one of {', '.join(PROVERS)}; got {config.prover!r}")
    for name in ("progress_rollouts", "prover_best_of"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(config, name)}")
    if not REWARDS[config.reward].progress:
        changed = [f"--{name}" for name, default in PROGRESS_DEFAULTS.items() if getattr(config, name) != default]
        if changed:
            raise ValueError(f"{changed[0]} applies to --reward progress and gold+progress only, got --reward "
                             f"{config.reward}")
        return
    if config.use_vllm:
        raise ValueError(f"--reward {config.reward} samples the prover's continuations with --use_vllm false only, "
                         "got --use_vllm true")
    if config.gamma != 1:
        raise ValueError(f"--reward {config.reward}: a step's progress is an undiscounted change of the prover's "
                         f"chance (--gamma 1), got --gamma {config.gamma}")
    if config.reward_normalize:
        raise ValueError(f"--reward_normalize does not apply to --reward {config.reward} (progress is added after "
                         "the rewards are normalised; --whiten_advantages scales the advantages)")
    if config.prover == "policy" and config.num_generations < 2:
        raise ValueError("--prover policy values each prompt by its other samples: it needs --num_generations >= 2")


PROGRESS_DEFAULTS = {"progress_coef": 1.0, "progress_rollouts": 4, "prover": "policy", "prover_best_of": 1}
"""The progress reward's settings and their defaults (StepPPOConfig's; a run stored before they
existed resumes with them)."""


def check_online_update(config) -> None:
    """ValueError unless --verifier_online_update has an implicit PRM to train (an `implicit:` verifier,
    alone or a part of a combination, read by a verifier reward)."""
    if not config.verifier_online_update:
        return

    implicit = any(k.trains_online for k in kinds_of(config.verifier))
    if not REWARDS[config.reward].verifier or not implicit:
        raise ValueError(f"--verifier_online_update trains an implicit PRM: it needs --verifier implicit:PATH and a "
                         f"verifier reward; got --verifier {config.verifier} --reward {config.reward}")
    if config.verifier_online_steps < 1:
        raise ValueError(f"--verifier_online_steps must be >= 1, got {config.verifier_online_steps}")
    if not config.verifier_online_learning_rate > 0:
        raise ValueError(f"--verifier_online_learning_rate must be > 0, got {config.verifier_online_learning_rate}")


def check_length_drift(config) -> None:
    """The length-drift guard's settings (`rl.length_drift`)."""
    if not config.length_drift_threshold > 0:
        raise ValueError(f"--length_drift_threshold must be > 0, got {config.length_drift_threshold}")
    if config.length_drift_updates < 1:
        raise ValueError(f"--length_drift_updates must be >= 1, got {config.length_drift_updates}")


def check_weights(config) -> None:
    """ValueError for a negative KL or entropy weight, a reward clip not above 0, or --reward_weights
    that do not give one weight per --reward_funcs entry."""
    if config.beta < 0:
        raise ValueError(f"--beta must be >= 0, got {config.beta}")
    if config.entropy_coef < 0:
        raise ValueError(f"--entropy_coef must be >= 0, got {config.entropy_coef}")
    if config.reward_weights is not None and len(config.reward_weights) != len(config.reward_funcs or []):
        raise ValueError(f"--reward_weights gives {len(config.reward_weights)} weights for "
                         f"{len(config.reward_funcs or [])} --reward_funcs")
    if config.reward_clip is not None and config.reward_clip <= 0:
        raise ValueError(f"--reward_clip must be > 0, got {config.reward_clip}")


def check_ranges(config) -> None:
    """ValueError for a count under 1 (or 0 where 0 means none), a temperature or time limit not
    above 0, or a discount outside [0, 1]."""
    for name in ("max_steps", "prompts_per_update", "num_generations", "max_completion_length", "num_iterations",
                 "num_mini_batches", "n_prompts", "generation_batch_size", "continuation_batch_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(config, name)}")
    for name in ("n_probe", "probe_every", "continuation_boundaries", "continuation_round_tokens"):
        if getattr(config, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(config, name)}")
    for name in ("temperature", "max_train_seconds", "max_generated_tokens"):  # None: no limit
        if getattr(config, name) is not None and not getattr(config, name) > 0:
            raise ValueError(f"--{name} must be > 0, got {getattr(config, name)}")
    if not 0 <= config.gamma <= 1 or not 0 <= config.lam <= 1:
        raise ValueError("--gamma and --lam must be in [0, 1]")


def check_estimator_settings(config) -> None:
    """What the chosen estimator's registered flags allow: groups need two samples or more, reward
    scales and dropped flat groups need the group estimator's, and Monte Carlo values their own settings."""
    estimator = ESTIMATORS[config.advantage_estimator]
    if estimator.groups and config.num_generations < 2:
        raise ValueError(f"--advantage_estimator {config.advantage_estimator} needs --num_generations >= 2")
    # REWARD_SCALES[0], GRPO's per-group scale, is the default and what every estimator computes with
    if config.scale_rewards != REWARD_SCALES[0] and not estimator.scales_rewards:
        raise ValueError(f"--scale_rewards {config.scale_rewards} needs --advantage_estimator group (it scales "
                         f"group-centred rewards); got {config.advantage_estimator!r}")
    if config.drop_flat_groups and not estimator.drops_flat_groups:
        raise ValueError("--drop_flat_groups needs --advantage_estimator group (it drops the prompts whose "
                         f"samples all got the same rewards); got {config.advantage_estimator!r}")
    if estimator.monte_carlo:
        check_mc_values(config)
    if config.hf_decoding not in HF_DECODING:
        raise ValueError(f"--hf_decoding must be one of {', '.join(HF_DECODING)}; got {config.hf_decoding!r}")
    if config.hf_decoding == "loop" and config.use_vllm:
        raise ValueError("--hf_decoding loop decodes with transformers; with --use_vllm true vLLM samples the "
                         "rollouts and no continuation is sampled: drop one of the two")
    if config.hf_decoding == "loop" and config.continuation_sampling == "shared" and (
            estimator.monte_carlo or REWARDS[config.reward].progress):
        raise ValueError("--hf_decoding loop applies to --continuation_sampling separate (shared continues "
                         "from a cut KV cache through generate)")
    if config.continuation_round_tokens and config.continuation_sampling != "separate":
        raise ValueError("--continuation_round_tokens applies to --continuation_sampling separate, got "
                         f"{config.continuation_sampling}")
    if config.continuation_boundaries and not (estimator.monte_carlo or REWARDS[config.reward].progress):
        raise ValueError("--continuation_boundaries applies to --advantage_estimator mc_values and --reward "
                         f"progress or gold+progress only, got --reward {config.reward} with --advantage_estimator "
                         f"{config.advantage_estimator}")


VLLM_MODES = ("colocate", "server")
"""--vllm_mode: an engine in each training process, or a running server (`backends.vllm_server`)."""


def check_vllm_mode(config) -> None:
    """--vllm_mode and the server's flags: a server needs --use_vllm true and an http(s) URL; the server
    flags without --vllm_mode server would do nothing."""
    if config.vllm_mode not in VLLM_MODES:
        raise ValueError(f"--vllm_mode must be one of {', '.join(VLLM_MODES)}; got {config.vllm_mode!r}")
    if config.vllm_mode != "server":
        if config.vllm_server_url is not None:
            raise ValueError("--vllm_server_url is read with --vllm_mode server only; add --vllm_mode server "
                             "(and --use_vllm true)")
        return
    if not config.use_vllm:
        raise ValueError("--vllm_mode server samples rollouts with vLLM: it needs --use_vllm true")
    url = config.vllm_server_url
    if not url:
        raise ValueError("--vllm_mode server needs --vllm_server_url, the address of a server started with "
                         "python -m backends.vllm_server (e.g. http://localhost:8000)")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--vllm_server_url must start with http:// or https://; got {url!r}")
    if not config.vllm_server_timeout > 0:
        raise ValueError(f"--vllm_server_timeout must be > 0, got {config.vllm_server_timeout}")
