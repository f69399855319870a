"""Process annotation: step labels for a policy's own reasoning paths, without human labels.

    python -m reward_models.annotate --method {tree,mc,autopsv,exact,outcome} --policy D \\
        [--data world | F.jsonl | gsm8k] [--n N] [--seed S] --out A.jsonl

Every method samples paths from the policy `D` and gives each step a label in [0, 1], the
estimated probability that the path so far still leads to the correct answer:

- ``tree`` (StepCo): a binary tree per question. Each node's two children are one-step
  continuations of the node's prefix, one from the positive prompt (`solve_prompt`, sampled at
  `--temperature_pos`) and one from the exploratory prompt (`explore_prompt`,
  `--temperature_neg`); identical sibling steps (after strip) are kept once. A step that states
  an answer (`<ans>`, "answer is", `\\boxed`) is a leaf; so is a step at `--max_depth` (capped), a
  step cut by the token limit (truncated) and a node whose continuations were all empty (dead
  end); leaves without an answer are incorrect. A step's label is the fraction of the leaves
  below it (itself included) whose answer is correct, so a parent's label is the leaf-weighted
  mean of its children's labels. One row per root-to-leaf path.
- ``mc`` (Math-Shepherd): `--paths_per_problem` full paths at `--temperature`; from each prefix
  steps[:i+1] (every step but the last) `--rollouts` completions; the step's soft label is the
  fraction that reach the gold answer (`--hard`: 1.0 if any does; `--best_of K`: the chance that
  one of K continuations does, PAV's Best-of-K prover, by the unbiased pass@K estimate). The last
  step's label is the path's own correctness. Identical prefixes of one question share their
  rollouts. The labels are the policy's success probability after each step, so a PSV trained on
  them and paid as `--reward step` pays by default (the delta form) gives PAV's progress rewards
  with no continuation sampled during RL: the rollouts are paid once.
- ``autopsv`` (AutoPSV): paths sampled as in mc. The paths of an `--orm_train_fraction` of the
  questions, labelled with their answer correctness only, train an outcome verifier with
  `reward_models.train.train_verifier(..., outcome_only=True)`, initialised from the policy and
  saved under `<out>.orm/` (reused when it is already there). The paths of the *other* questions
  are then labelled from the verifier's per-step scores s_0..s_{n-1} alone, no gold answer used.
  With s_{-1} the mean score of the first step over all ORM-training paths (the baseline):

      step k is wrong   if  (s_k - s_{k-1}) / s_{k-1} < --drop_threshold   (default -0.5)

  i.e. when the verifier's confidence falls by more than half from the step before (a previous
  score of 0 cannot fall further: no drop). Once a step is wrong every later step is wrong too
  (label 0.0); all other steps get 1.0. Rows also carry the scores (`orm_scores`).
- ``exact`` (world problems only, a reference): paths sampled as in mc, labelled by the world's
  step checker.
- ``outcome`` (any data with gold answers): paths sampled as in mc, every step labelled with the
  path's answer check (1.0 right, 0.0 wrong) and no rollout: the outcome-labelled samples an
  outcome verifier or PRIME's implicit PRM (`reward_models.implicit_prm`) learns from.

Output: a TRL stepwise-supervision JSONL file, one row per path::

    {"id": "<problem_id>/<method>/<k>", "problem_id", "prompt": <question>, "completions": [steps],
     "labels": [floats], "method", "answer_correct": bool, "exact_labels": [...] (world rows)}

where `exact_labels` (1.0 before the world checker's earliest error, 0.0 from it on) measure label
quality. A JSON summary (also written to `<out>.summary.json`) gives problems, rows, steps, the
mean label, generated tokens, seconds, counts of bad generations (no steps, no answer, truncated,
empty or duplicate steps), the problems left out because their prompt does not fit the policy's
context with `--max_new_tokens` (`prompt_too_long`; an empty question is refused) and, on world
data, the agreement with the exact labels (mean absolute error and the accuracy of `label >= 0.5`).

Resuming: problems are annotated in groups of `--batch_size`: all paths, all rollouts, or all
frontier nodes of a tree level (one call per prompt style, their temperatures differ) of a group
go into one generate call. After a group, the rows of each of its problems are appended
together and fsynced, then the problem id and its row count go to `<out>.done`. On start, rows of
problems without a matching done entry (a run killed mid-write) and a trailing partial line are
dropped, and finished problems are skipped; a group is re-sampled with the same seeds, so a
resumed run writes the same rows as an uninterrupted one. `<out>.meta.json` holds the settings;
resuming with other settings is refused (`--overwrite` starts afresh).
"""

from reward_models.annotate.autopsv import autopsv_labels
from reward_models.annotate.base import METHODS, AnnotateConfig, AnnotationError, GroupAnnotator, exact_labels
from reward_models.annotate.cli import main
from reward_models.annotate.mc import mc_label
from reward_models.annotate.run import annotate
from reward_models.annotate.train_psv import NoAnnotatedPaths, train_on_annotation
from reward_models.annotate.tree import TreeNode, tree_paths

__all__ = [
    "METHODS",
    "AnnotateConfig",
    "AnnotationError",
    "GroupAnnotator",
    "NoAnnotatedPaths",
    "TreeNode",
    "annotate",
    "autopsv_labels",
    "exact_labels",
    "main",
    "mc_label",
    "train_on_annotation",
    "tree_paths",
]
