"""Settings of step-level PPO (`accelerate launch rl/ppo_step.py`), TRL-style: a `TrainingArguments`
subclass whose defaults are the embedded CPU run; a YAML recipe (`--config`) turns it into a GPU run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from reasoning.steps import ANSWER_MATCHES
from reward_models.load import kinds_of
from reward_models.verifier import AGGREGATIONS
from rl.distributed import deepspeed_launch, has_gpu, without_shm_op
from rl.ppo_checks import (
    AUTO,
    check_estimator_settings,
    check_length_drift,
    check_online_update,
    check_progress,
    check_ranges,
    check_vllm_mode,
    check_weights,
    resolve_credit_form,
    resolve_eval_dataset,
)
from rl.ppo_config_continuations import CONTINUATION_SAMPLING, ContinuationSettings
from rl.ppo_math import ESTIMATORS, REWARD_SCALES, STEP_CREDITS
from rl.rewards import REWARDS
from rl.step_rewards import SHAPING_MODES

DEFAULT_POLICY = "outputs/sft_tiny"
"""The default policy: `python -m rl.sft`'s embedded default, built first when absent (rl/build_defaults.py)."""
DEFAULT_VERIFIER_LM = "outputs/sft_tiny_clean"
"""The default verifier LM: the tiny policy's recipe taught by the clean teacher (no step label)."""
DEFAULT_VERIFIER = f"step-likelihood:{DEFAULT_VERIFIER_LM}"
"""The default verifier: the verifier LM's step likelihood (docs/results/reward_agreement.md, "Does a verifier order the
policy's own samples as the answer check does?": the verifier without exact labels whose reward
raises greedy accuracy here; the tiny PSVs' do not)."""
TREE_PSV = "outputs/psv_tiny"
"""The tiny PSV from StepCo-tree labels of the policy's own paths, built when named and absent."""
BUILDABLE_VERIFIERS = (DEFAULT_VERIFIER, TREE_PSV)

REWARD_MODES = tuple(REWARDS)
ADVANTAGE_ESTIMATORS = tuple(ESTIMATORS)
KL_ESTIMATORS = ("k1", "k2", "k3")


class ConfigError(ValueError):
    """A flag, a recipe key or a value that the run cannot use (reported as one line, exit code 2)."""


@dataclass
class StepPPOConfig(TrainingArguments, ContinuationSettings):
    """Step-level PPO with process-supervised rewards (Math-Shepherd's step-by-step PPO)."""

    output_dir: str | None = field(default="outputs/ppo_step", metadata={"help": "Run directory."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start afresh in an OUTPUT_DIR that holds an earlier run, clearing it first (without "
                          "it, a fresh run refuses a non-empty folder; see rl/run_dir.py)."},
    )

    # --- models -------------------------------------------------------------------------------
    model_name_or_path: str = field(
        default=DEFAULT_POLICY,
        metadata={"help": "The policy: an SFT save_pretrained directory or a Hub id (was --policy)."},
    )
    sft_seed: int = field(
        default=0,
        metadata={"help": "Training seed of the tiny SFT policy built first when --model_name_or_path is the default "
                          "path and absent (`python -m rl.sft --seed`): each seed draws another policy, as a user's "
                          "own SFT run would. A default policy already there that was built with another seed is "
                          "refused before anything loads."},
    )
    verifier: str = field(
        default=DEFAULT_VERIFIER,
        metadata={"help": "Verifier spec (reward_models.load): a PSV directory, 'exact' (world only), "
                          "'step-confidence:PATH' (a frozen policy's own probabilities), "
                          "'step-likelihood:PATH' (a verifier LM's probabilities of each step), 'product:A,B', "
                          "... Read only by --reward step, outcome and step+gold. The default is a labelled "
                          "reference, not a user's verifier: a verifier LM taught by the clean teacher (privileged "
                          "demonstrations: the tiny policy's recipe with `python -m rl.sft --teacher_noise none` in "
                          f"the policy's world; no step label, no gold answer). It and '{TREE_PSV}' (a PSV "
                          "from StepCo-tree labels of the policy's own paths) are built first when absent "
                          "(--build_missing)."},
    )
    build_missing: bool = field(
        default=True,
        metadata={"help": "Build the tiny SFT policy and verifier first when `policy` / `verifier` are the "
                          "default paths and absent (the no-argument CPU run)."},
    )
    critic_init: str = field(
        default="verifier",
        metadata={"help": "Critic start: 'verifier' (the PSV's weights, TRL's choice of a reward model as "
                          "value model, or the PSV part of a combined verifier; needs the policy's tokenizer) or "
                          "'policy' (the policy backbone, new head)."},
    )
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters; the reference is the base "
                                                             "with adapters disabled."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "LoRA target modules (comma list)."})
    num_threads: int = field(
        default=0,
        metadata={"help": "torch threads per process; 0: the machine's cores shared among the processes "
                          "(accelerate launch sets OMP_NUM_THREADS=1, which would leave cores idle in a one-process "
                          "run)."},
    )
    dtype: str = field(default="auto", metadata={"help": "Model dtype: auto (float32 on CPU), bfloat16, float32."})

    # --- data ---------------------------------------------------------------------------------
    dataset: str = field(
        default="world",
        metadata={"help": "Training prompts: 'world' (its train split), a .jsonl/.json/.parquet/.csv file, a "
                          "save_to_disk folder (FOLDER[:SPLIT], default train) or a Hub id (ID[:CONFIG]:SPLIT). "
                          "A test split (a benchmark name, a file named *test*) is refused without "
                          "--allow_test_split."},
    )
    n_prompts: int = field(default=4000, metadata={"help": "Training prompts (the first N; world: drawn with a seed "
                                                            "unseen in SFT)."})
    eval_dataset: str = field(default="auto", metadata={
        "help": "Greedy evaluation set: 'auto' (the world's test split when training on the world; with your own "
                "--dataset, its last tenth of rows, at most --n_eval, held apart from training), 'world' (its test "
                "split), a benchmark, a file, a folder, a Hub id, or 'none'. It may share no question with "
                "--dataset."})
    n_eval: int = field(default=500, metadata={"help": "Evaluation problems (world: the test split; held-apart rows "
                                                       "of --dataset under --eval_dataset auto: at most this many)."})
    question_column: str | None = field(
        default=None,
        metadata={"help": "Column of the question in --dataset / --eval_dataset rows (default: the first of "
                          "question, problem, prompt)."},
    )
    answer_column: str | None = field(
        default=None,
        metadata={"help": "Column of the gold answer (default: the first of answer, solution, completion); a GSM8K "
                          "'... #### N' or a MATH '\\boxed{...}' solution is reduced to its answer."},
    )
    allow_test_split: bool = field(
        default=False,
        metadata={"help": "Train on a test split all the same (a benchmark's test set, a file named *test*)."},
    )
    n_probe: int = field(
        default=100,
        metadata={"help": "Probe problems for the learning curve (world: the dev split; otherwise the first "
                          "training prompts); 0 turns probing off."},
    )
    probe_every: int = field(
        default=10,
        metadata={"help": "Every N updates (and at the start and end), greedy accuracy on the probe problems and "
                          "sampled accuracy on those greedy got wrong at the start, logged as probe/*."},
    )
    world_seed: int = field(default=0, metadata={"help": "Seed of the world's test split (as in SFT)."})

    # --- rollouts -----------------------------------------------------------------------------
    max_steps: int = field(default=120, metadata={"help": "PPO updates (rollout batch, then optimisation; was "
                                                          "--num_updates)."})
    max_train_seconds: float | None = field(default=None, metadata={"help": "This launch's time limit on updates: "
        "none starts that the last shows would end past it; then save, evaluate and write eval.json (stopped_early) "
        "as at --max_steps; --resume_from_checkpoint auto continues. Evaluation not counted. None: no limit."})
    max_generated_tokens: int | None = field(default=None, metadata={"help": "The run's budget of sampled tokens "
        "(rollout/tokens_cumulative: responses and every continuation, mc_values' and the prover's, all processes): "
        "no update starts that the last shows would end past it; then as at --max_steps (stopped_early). For "
        "comparisons at equal generated tokens. None: no budget."})
    length_drift_threshold: float = field(default=0.2, metadata={"help": "The length-drift guard (rl/length_drift.py): "
        "one warning line each time |rollout/length_drift| (steps or tokens per response, the mean of the last "
        "--length_drift_updates updates against that of the first, as a relative change) passes this value from "
        "below (0.2: a change of a fifth)."})
    length_drift_updates: int = field(default=3, metadata={"help": "Updates in each of the two means that "
                                                                   "rollout/length_drift compares."})
    stop_on_length_drift: bool = field(default=False, metadata={"help": "End the run when the length drift passes "
        "--length_drift_threshold: save, evaluate and write eval.json (stopped_early: length_drift) as at "
        "--max_steps."})
    prompts_per_update: int = field(default=16, metadata={"help": "Prompts per update per process."})
    num_generations: int = field(default=8, metadata={"help": "Responses sampled per prompt, a group (was "
                                                               "--samples_per_prompt)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of rollouts."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling of rollouts."})
    max_completion_length: int = field(default=128, metadata={"help": "Response length limit in tokens (was "
                                                                       "--max_new_tokens)."})
    chat_template: bool = field(
        default=True,
        metadata={"help": "Prompt the policy through its tokenizer's chat template when it has one, in rollouts "
                          "and greedy evaluation alike (false: the plain prompt)."},
    )
    use_vllm: bool = field(
        default=False,
        metadata={"help": "Sample rollouts with vLLM: a colocated engine (GPU, the [vllm] extra, a clear error without "
                          "it: it gets the policy's weights before every rollout; see docs/ppo.md) or a server "
                          "(--vllm_mode server); false: transformers generate (was --rollout_backend hf|vllm)."},
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "--use_vllm: share of each GPU's memory the colocated vLLM engine takes "
                          "(weights and KV cache), beside the training models."},
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={"help": "--use_vllm: 'colocate' (an engine in each training process) or 'server' (rollouts "
                          "from a running `python -m backends.vllm_server`, given new weights after every update; "
                          "docs/gpu.md)."},
    )
    vllm_server_url: str | None = field(
        default=None, metadata={"help": "--vllm_mode server: the server's address, e.g. http://host:8000."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "--vllm_mode server: seconds any one request to the server may take."})
    vllm_server_weights_dir: str | None = field(default=None, metadata={
        "help": "--vllm_mode server: where rank 0 writes the merged policy for the server to reload, a path the "
                "server reads too (default OUTPUT_DIR/vllm_policy)."})
    generation_batch_size: int = field(default=128, metadata={"help": "Sequences per generate call."})

    # --- rewards ------------------------------------------------------------------------------
    reward: str = field(
        default="gold",
        metadata={"help": f"Reward: {', '.join(REWARD_MODES)}. The default, 'gold', is the answer check of each "
                          "response against its training prompt's gold answer (1 right, 0 wrong): what a user "
                          "has, no verifier. 'outcome' is the verifier's whole-path score (--outcome_aggregation) "
                          "on the last token (the ORM-PPO baseline); 'step' pays the verifier's score at the end "
                          "of every step; 'step+gold' both (figures of each: docs/results/rl_noisy_world.md). "
                          "'progress' pays each step its progress under --prover (PAV), 'gold+progress' the answer "
                          "check and --progress_coef x progress (docs/results/progress_rewards.md)."},
    )
    reward_shaping: str = field(
        default=AUTO,
        metadata={"help": f"Step score shaping: {', '.join(SHAPING_MODES)}, or 'auto' (the default): 'delta' for "
                          "--reward step or step+gold with a verifier whose score is a value (a PSV, "
                          "a published PRM, 'exact'; with --step_credit auto: each step paid its own change, "
                          "credited to its own tokens; rl/ppo_checks.STEP_REWARD_FORM), 'raw' for either "
                          "with a verifier that judges each step on its own ('step-likelihood', as the default "
                          "verifier, or 'step-confidence'; with --step_credit auto: return credit; "
                          "rl/ppo_checks.JUDGED_STEP_FORM), 'raw' otherwise. 'raw' (each "
                          "step paid its own score) suits verifiers that judge each step on its own; 'centered' "
                          "pays p_k - 0.5 (under --advantage_estimator group the same advantages as 'raw': the "
                          "group mean takes the constant off); 'delta' (each step paid for how much it moved the "
                          "score, p_k - p_(k-1) with p_0 = 0.5, so a path's total is p_last - 0.5 whatever its "
                          "number of steps) suits a PSV, whose score is a value; 'min' credits only the "
                          "lowest-scored step. run_config.json records the resolved value."},
    )
    outcome_aggregation: str = field(
        default="mean",
        metadata={"help": f"--reward outcome: the verifier's whole-path score from its step scores, one of "
                          f"{', '.join(AGGREGATIONS)}. 'mean' (StepCo's path score) suits verifiers that judge "
                          f"each step on its own, as the default step-likelihood one does; 'last' is a PSV's "
                          f"score at the final step (a value); 'min' with --reward_shaping min gives outcome "
                          f"the same total reward as step, differing only in where it lands."},
    )
    step_reward_weight: float = field(default=1.0, metadata={"help": "Scale of verifier rewards."})
    gold_reward_weight: float = field(
        default=1.0, metadata={"help": "Scale of the gold outcome reward (1 right, 0 wrong)."})
    answer_match: str = field(
        default="strict",
        metadata={"help": f"The answer check, one of {', '.join(ANSWER_MATCHES)}: what the gold reward (--reward gold, "
                          "step+gold, and mc_values' continuations), the online implicit PRM's labels and the probe's "
                          "sampled accuracy count as right. 'strict' (the default) counts only a stated answer "
                          "(<ans>, 'answer is', \\boxed), so a policy is not paid for ending on a number it guessed; "
                          "'flexible' takes the evaluation's extraction, the last number when no answer is stated "
                          "(lm-eval-harness's flexible-extract; inference.evaluate reports accuracy under both)."},
    )
    missing_eos_penalty: float = field(
        default=1.0, metadata={"help": "Subtracted at the last token of a truncated response."})
    no_answer_penalty: float = field(
        default=0.5, metadata={"help": "Subtracted at the last token of a response with no answer."})
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Your own reward functions, added to --reward: FILE.py:FUNCTION, MODULE:FUNCTION or "
                          "MODULE.FUNCTION, each called in TRL's reward_funcs shape (prompts, completions, "
                          "completion_ids, and the columns question, answer, id, problems, steps) and returning one "
                          "float per completion (paid at its last token), None (nothing), or, from a function with "
                          "per_step = True, a list with one reward per step (rl/rewards.py). Runs as your code."},
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weights of --reward_funcs, in their order (default 1 each), as TRL's reward_weights."},
    )
    reward_clip: float | None = field(default=None, metadata={"help": "Clip each placed reward to [-c, c]."})
    reward_normalize: bool = field(default=False, metadata={"help": "Divide rewards by their running std."})

    # --- online verifier update (PRIME) --------------------------------------------------------
    verifier_online_update: bool = field(
        default=False,
        metadata={"help": "Keep an implicit PRM verifier (implicit:PATH) current, as PRIME does: after each update's "
                          "rewards, train it on that update's rollouts and their answer-check labels "
                          "(reward_models.implicit_prm). Only with an implicit: verifier."},
    )
    verifier_online_steps: int = field(default=1, metadata={"help": "--verifier_online_update: optimiser steps "
                                                                    "of the PRM per PPO update."})
    verifier_online_learning_rate: float = field(default=1e-6, metadata={"help": "--verifier_online_update: "
                                                                                 "the PRM's learning rate."})

    # --- PPO ----------------------------------------------------------------------------------
    advantage_estimator: str = field(
        default="group",
        metadata={"help": "gae (critic), rloo (leave-one-out baseline, no critic) or group (no critic: every "
                          "step reward normalised over the rewards of its prompt's samples, a token's advantage "
                          "the sum of the normalised rewards of the steps ending at or after it, DeepSeekMath's "
                          "process supervision; an outcome or gold reward is one reward at the last token, which makes "
                          "it GRPO; under --reward_shaping min a path's one reward is its weakest step's score at "
                          "that step's end; the KL penalty is GRPO's k3 loss term, not a reward; "
                          "ppo_math.group_step_advantages) or mc_values (no critic: VinePPO's Monte Carlo values "
                          "of step boundaries, see --mc_rollouts; ppo_math.step_value_advantages)."},
    )
    step_credit: str = field(
        default=AUTO,
        metadata={"help": "--advantage_estimator group with step rewards: 'return' (a token's advantage is the sum of "
                          "the normalised rewards of its step and every later one), 'own' (its own step's normalised "
                          "reward alone; ppo_math.group_step_advantages(credit='own')) or 'auto' (the default: as "
                          "--reward_shaping's auto: 'own' for step, step+gold and the progress rewards, 'return' "
                          "otherwise and for step or step+gold with a verifier that judges each step on its own). "
                          "docs/results/when_step_rewards_pay.md has the three-seed tables: own-step delta is not "
                          "gamed by a value's rewards, DeepSeekMath's raw/return lost 5 points with the step "
                          "checker's 1/0 scores and held with a step likelihood. With one reward per response the "
                          "two are the same."},
    )
    scale_rewards: str = field(
        default="group",
        metadata={"help": f"--advantage_estimator group: what a group's rewards are divided by once their mean is "
                          f"taken off, one of {', '.join(REWARD_SCALES)} (TRL's scale_rewards). 'group': their "
                          f"standard deviation (GRPO), which makes a reward's weight do nothing in a group where it "
                          f"alone varies (a verifier's scores where every sample failed the answer check); 'batch': "
                          f"the standard deviation of the whole rollout batch's rewards (this process's), so that "
                          f"small differences stay small and --step_reward_weight sets the verifier's share; 'none': "
                          f"nothing (Dr. GRPO). Runs stored before it existed resume with 'group'."},
    )
    drop_flat_groups: bool = field(
        default=False,
        metadata={"help": "Under the group estimator, leave out of the loss (policy, KL and entropy terms) every "
                          "sample of a prompt whose samples all got the same rewards, as DAPO filters them: they "
                          "carry no signal, and inside the token mean they only shrink the step on the others. Off by "
                          "default; runs stored before it existed resume with it off."},
    )
    gamma: float = field(default=1.0, metadata={"help": "Discount."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Normalise advantages per batch."})
    num_iterations: int = field(default=2, metadata={"help": "Optimisation passes over each rollout batch (was "
                                                              "--ppo_epochs)."})
    num_mini_batches: int = field(default=4, metadata={"help": "Minibatches per pass."})
    epsilon: float = field(default=0.2, metadata={"help": "Policy ratio clip (was --cliprange)."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Value clip."})
    vf_coef: float = field(default=0.5, metadata={"help": "Value loss weight."})
    entropy_coef: float = field(
        default=0.0,
        metadata={"help": "Entropy bonus: the loss subtracts entropy_coef times the policy's mean per-token "
                          "entropy (nats) on the sampled responses (at the sampling temperature), against the collapse "
                          "of sampling diversity late in a run. 0: off; runs stored before it existed resume with 0."},
    )
    beta: float = field(default=0.02, metadata={"help": "KL penalty coefficient (initial, if adaptive; was "
                                                         "--kl_coef)."})
    kl_estimator: str = field(default="k1", metadata={"help": f"Per-token KL estimator: {', '.join(KL_ESTIMATORS)}."})
    adaptive_kl: bool = field(default=False, metadata={"help": "Ziegler et al.'s adaptive KL controller."})
    kl_target: float = field(default=0.5, metadata={"help": "Adaptive KL: target KL per response."})
    kl_horizon: int = field(default=10000, metadata={"help": "Adaptive KL: horizon in responses."})
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Critic learning rate (default: learning_rate)."})
    critic_warmup_updates: int = field(default=5, metadata={"help": "Updates that train only the critic first (gae)."})
    disable_dropout: bool = field(
        default=True,
        metadata={"help": "Turn dropout off in policy, critic and reference: PPO compares forwards of the same "
                          "weights, which dropout would make differ by noise."},
    )

    # --- optimisation (TrainingArguments fields with the CPU defaults) ------------------------
    learning_rate: float = field(default=2e-5, metadata={"help": "Policy learning rate."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "Learning-rate schedule."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping."})
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPU recipes)."})
    seed: int = field(default=0, metadata={"help": "Seed of prompt order, sampling and initialisation."})
    save_steps: float = field(default=20, metadata={"help": "Checkpoint every N updates (0: only at the end)."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N updates."})
    logging_dir: str | None = field(
        default=None,
        metadata={"help": "Directory of file-writing trackers (tensorboard); default OUTPUT_DIR/runs. The project is "
                          "--project (else $WANDB_PROJECT, else steprl-ppo), the run --run_name (rl/tracking.py)."},
    )
    greedy_eval_batch_size: int = field(default=100, metadata={"help": "Batch size of greedy evaluation."})
    bootstrap_resamples: int = field(default=2000, metadata={"help": "Resamples of the paired bootstrap."})

    def __post_init__(self):
        if self.ddp_backend is None and deepspeed_launch() and not has_gpu():
            # TrainingArguments makes the process group here; DeepSpeed without a GPU runs on gloo
            # (accelerate picks no backend for it, and every rank would be process 0 of 1)
            self.ddp_backend = "gloo"
        if deepspeed_launch():
            without_shm_op()  # before TrainingArguments starts DeepSpeed's process group (no-op on a GPU)
        super().__post_init__()
        self.validate()

    def _validate_args(self):
        if not (self.bf16 and not has_gpu()):
            return super()._validate_args()
        # --bf16 is mixed precision run by the trainer's Accelerator: autocast on a CPU, DeepSpeed's
        # bf16 under DeepSpeed. TrainingArguments' check wants a bf16 GPU or use_cpu (which would
        # turn DeepSpeed off), so it is skipped for bf16 on a machine without a GPU.
        self.bf16 = False
        try:
            super()._validate_args()
        finally:
            self.bf16 = True

    def validate(self) -> None:
        """ValueError (one line, naming the flag) for settings that cannot work together. Every rule
        on the settings alone is here, written once; run on every config made (`__post_init__`), so
        the trainer and the set-up trust the config they are given. What the settings point at
        (files, models, prompt sets) is checked in rl/ppo_setup.py."""
        def choose(name, value, options):
            if value not in options:
                raise ValueError(f"--{name} must be one of {', '.join(options)}; got {value!r}")

        choose("reward", self.reward, REWARD_MODES)
        resolve_credit_form(self)  # 'auto' --reward_shaping / --step_credit: the reward mode's form
        resolve_eval_dataset(self)  # 'auto' --eval_dataset: the world's test split when training on the world
        choose("reward_shaping", self.reward_shaping, (*SHAPING_MODES, AUTO))
        choose("answer_match", self.answer_match, ANSWER_MATCHES)
        choose("outcome_aggregation", self.outcome_aggregation, AGGREGATIONS)
        choose("advantage_estimator", self.advantage_estimator, tuple(ESTIMATORS))  # registered ones too
        choose("step_credit", self.step_credit, (*STEP_CREDITS, AUTO))
        choose("scale_rewards", self.scale_rewards, REWARD_SCALES)
        choose("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        choose("critic_init", self.critic_init, ("verifier", "policy"))
        choose("continuation_sampling", self.continuation_sampling, CONTINUATION_SAMPLING)
        check_ranges(self)
        batch = self.prompts_per_update * self.num_generations
        if batch % self.num_mini_batches:
            raise ValueError(f"prompts_per_update * num_generations ({batch}) must be divisible by "
                             f"num_mini_batches ({self.num_mini_batches})")
        check_estimator_settings(self)
        check_weights(self)
        checkers = [k.name for k in kinds_of(self.verifier) if k.needs_world]
        if REWARDS[self.reward].verifier and checkers and self.dataset != "world":
            raise ValueError(f"the {checkers[0]} verifier checks world problems only: use --dataset world")
        check_online_update(self)
        check_progress(self)
        check_length_drift(self)
        check_vllm_mode(self)


def _own_settings() -> dict[str, object]:
    """StepPPOConfig's own settings (name -> annotation) in the order --help lists them: the
    continuation settings after --advantage_estimator, where they belong."""
    own = dict(StepPPOConfig.__annotations__)
    at = list(own).index("advantage_estimator") + 1
    names = [*list(own)[:at], *ContinuationSettings.__annotations__, *list(own)[at:]]
    return {name: own.get(name, ContinuationSettings.__annotations__.get(name)) for name in names}


OWN_SETTINGS = _own_settings()
"""Step PPO's own settings (those of StepPPOConfig and its ContinuationSettings), name -> annotation."""

