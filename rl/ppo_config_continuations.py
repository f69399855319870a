"""Settings of the continuations sampled from step boundaries: Monte Carlo step values
(`--advantage_estimator mc_values`, VinePPO) and progress rewards under a prover (`--reward progress`,
PAV), how they are batched (`rl/continuations.py`), and how rollouts and continuations are decoded
without vLLM (`rl/decoding.py`). A part of `rl.ppo_config.StepPPOConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTINUATION_SAMPLING = ("shared", "separate")


@dataclass
class ContinuationSettings:
    """Continuations from step boundaries (mc_values, progress rewards)."""

    mc_rollouts: int = field(
        default=4,
        metadata={"help": "--advantage_estimator mc_values: continuations sampled (rollout temperature) from "
                          "each step boundary inside a response (the prompt and its first j steps, 0 < j < n); "
                          "the boundary's value is their mean answer-check reward, the prompt's value the mean "
                          "reward of the prompt's other samples, the end's the response's own reward, and every "
                          "token of a step gets the change in value across it (tokens after the last step: the "
                          "last step's). Costs about mc_rollouts x (steps - 1) continuations per response, "
                          "logged as rollout/mc_tokens; needs --reward gold; the KL penalty is a k3 loss term."},
    )
    progress_coef: float = field(default=1.0, metadata={"help": "--reward progress, gold+progress: alpha, the "
                                                                 "weight of each step's progress (rl/progress.py)."})
    progress_rollouts: int = field(
        default=4,
        metadata={"help": "--reward progress, gold+progress: the prover's continuations from each step boundary "
                          "inside a response (and, --prover sft, from each prompt), graded by the answer check; "
                          "their mean is the boundary's Q. Their tokens are logged as rollout/progress_tokens."},
    )
    prover: str = field(default="policy", metadata={"help": "--reward progress, gold+progress: whose chance of a "
                                                             "right answer a step moves: 'policy' (the policy "
                                                             "being trained) or 'sft' (the frozen starting policy, "
                                                             "the KL reference)."})
    prover_best_of: int = field(default=1, metadata={"help": "K: the prover is Best-of-K of --prover (right when one "
                                                              "of K tries is; Q_K = 1 - (1 - q)^K, estimated as "
                                                              "pass@K from the continuations)."})
    continuation_boundaries: int = field(
        default=0,
        metadata={"help": "mc_values and progress rewards: continue from at most k boundaries inside each "
                          "response, evenly spaced over its steps (0: every boundary). The steps between two of "
                          "them form one segment, valued and credited as one step (SPO's segment-level values): "
                          "continuations cost about mc_rollouts x k instead of x (steps - 1), the credit is "
                          "coarser (rl.continuations.segment_ends; docs/results/progress_rewards.md)."},
    )
    continuation_sampling: str = field(
        default="separate",
        metadata={"help": "How mc_values' and the prover's continuations are sampled: 'separate' (every "
                          "prefix re-encoded by generate, chunks of generation_batch_size sorted by expected length; "
                          "the faster on a CPU: docs/results/progress_rewards.md) or 'shared' (identical prefixes "
                          "continued once; each response encoded once and every prefix's KV cache cut from it; "
                          "rl/continuations.py). The same sampling either way: generate's, at the rollout "
                          "temperature and top-p."},
    )
    continuation_round_tokens: int = field(
        default=0,
        metadata={"help": "--continuation_sampling separate: sample in rounds of at most this many new tokens; "
                          "a row not yet ended goes on in the next round from where it stopped, so a generate "
                          "call does not wait for its longest row while the others have ended (the same "
                          "distribution of continuations, other random draws). 0: one round, each call to its "
                          "rows' budget."},
    )
    hf_decoding: str = field(
        default="generate",
        metadata={"help": "How rollouts and --continuation_sampling separate's continuations are decoded without "
                          "vLLM: 'generate' (transformers': every row of a batch computed until its longest ends) "
                          "or 'loop' (rl/decoding.py: a row leaves the batch the step it ends; the same sampling, "
                          "fewer decoding steps; docs/results/progress_rewards.md)."},
    )
    continuation_batch_size: int = field(
        default=512,
        metadata={"help": "Continuation rows per call with --continuation_sampling shared, or separate under "
                          "--hf_decoding loop (whole responses' rows at a time; the KV cache grows with it)."},
    )
