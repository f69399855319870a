"""Training a process-supervised verifier (PSV) on stepwise data.

    python -m reward_models.train --data A.jsonl --init_from POLICY --output_dir V [--config cfg.yaml]
        [--loss mse|bce] [--outcome_only] [--lora] [--label_balance] [--skip_bad_rows] ...
    accelerate launch -m reward_models.train ...            # the same, on several processes

The data is TRL's stepwise-supervision format, one JSON object per line (what
`datasets.load_dataset("json")` reads): `{"id", "prompt": question, "completions": [step texts],
"labels": [floats in [0, 1]], ...}`. Boolean labels (TRL's own datasets) count as 0.0 / 1.0.

The PSV is the policy's backbone with a new scalar head (`reward_models.psv`). Every path is read
in one forward pass and the loss sits at the last token of each step's closing tag:

- `mse`: (sigmoid(logit) - label)^2, StepCo's loss on soft labels (the default);
- `bce`: binary cross-entropy with logits on the same soft labels.

`outcome_only` keeps only the last step's term (an outcome verifier, AutoPSV's first stage);
`label_balance` weights steps so that those labelled < 0.5 and those >= 0.5 carry the same total
weight. Training is a transformers `Trainer` (so `accelerate launch`, DeepSpeed, `report_to` and
checkpointing work as usual) with its loss replaced; the result is saved with `save_pretrained`
(a full model, or a LoRA adapter whose `base_model_name_or_path` is the absolute path it was
trained on) plus the tokenizer and `psv_config.json` (loss, outcome_only, lora, data statistics,
the loss on a probe of training rows before and after training).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from backends.model_files import check_model_path
from reasoning.jsonl import read_jsonl
from reasoning.threads import one_thread_unless_told
from reward_models.psv import encode_paths, init_psv_from_policy, load_psv_model
from reward_models.verifier import VerifierInputError, layout, validate_paths

logger = logging.getLogger(__name__)

LOSSES = ("mse", "bce")
HEAD_PREFIX = "score."
"""The parameters `*ForTokenClassification` adds on top of a causal LM's backbone (the PSV head)."""


# ---------------------------------------------------------------------------------------------
# Configuration.


@dataclass
class PSVArguments:
    """What to train on, what to start from and which loss to use."""

    data: str | None = field(
        default=None,
        metadata={"help": "Stepwise JSONL: one row per path with id, prompt, completions, labels."},
    )
    init_from: str | None = field(
        default=None,
        metadata={"help": "A policy (causal LM) to put a new head on, or an existing PSV (full or LoRA)."},
    )
    loss: str = field(
        default="mse",
        metadata={"help": "mse: (sigmoid(logit) - label)^2 (StepCo); bce: BCE-with-logits on soft labels.",
                  "choices": list(LOSSES)},
    )
    outcome_only: bool = field(
        default=False, metadata={"help": "Put the loss on the last step only (an outcome verifier)."}
    )
    label_balance: bool = field(
        default=False,
        metadata={"help": "Weight steps so those labelled < 0.5 and >= 0.5 carry equal total weight."},
    )
    lora: bool = field(default=False, metadata={"help": "Train a LoRA adapter (the head stays fully trainable)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA alpha; default 2 * lora_r."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: str | None = field(
        default=None,
        metadata={"help": "Comma-separated module names, or all-linear; default peft's choice for the architecture."},
    )
    skip_bad_rows: bool = field(
        default=False,
        metadata={"help": "Skip malformed or too-long rows (counted in psv_config.json) instead of failing."},
    )
    max_length: int | None = field(
        default=None, metadata={"help": "Longest tokenized path; default the model's max_position_embeddings."}
    )
    loss_probe_rows: int = field(
        default=256, metadata={"help": "Training rows on which the loss is measured before and after training."}
    )

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")


@dataclass
class PSVTrainingConfig(TrainingArguments):
    """transformers' TrainingArguments with the PSV's embedded CPU defaults."""

    output_dir: str | None = field(default=None, metadata={"help": "Where the PSV is saved (required)."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the data."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Paths per batch per process."})
    save_strategy: str = field(default="no", metadata={"help": "Checkpointing during training."})
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Logging integrations: none, wandb, trackio, tensorboard, all."}
    )
    logging_steps: float = field(default=10, metadata={"help": "Log every N optimizer steps."})
    bf16: bool | None = field(default=False, metadata={"help": "bf16 mixed precision (GPU recipes)."})
    use_cpu: bool | None = field(
        default=None, metadata={"help": "Train on the CPU; default: when no CUDA device is available."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep every column: the collator reads prompt, completions, labels."}
    )
    seed: int = field(default=0, metadata={"help": "Training seed."})

    def __post_init__(self) -> None:
        if self.output_dir is None:
            raise ValueError("--output_dir is required: where the trained PSV is saved")
        if self.use_cpu is None:
            self.use_cpu = not torch.cuda.is_available()
        if self.label_names is None:
            self.label_names = ["step_targets"]
        super().__post_init__()


# ---------------------------------------------------------------------------------------------
# Data: validation, weights, batches.


class BadRowError(ValueError):
    """A stepwise row that cannot be trained on; the message names the row (and file line)."""


def row_name(index: int, row: Any, line: int | None = None, source: str | None = None) -> str:
    """"row 11 (id 'x')", prefixed with "A.jsonl:12: " when the file and line are known."""
    rid = row.get("id") if isinstance(row, dict) else None
    name = f"row {index}" + (f" (id {rid!r})" if rid is not None else "")
    return f"{source}:{line}: {name}" if source is not None and line is not None else name


def check_row(row: Any) -> tuple[str, list[str], list[float]]:
    """(prompt, steps, labels as floats) of a valid stepwise row; ValueError saying what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("field 'prompt' must be a non-empty string")
    steps, labels = row.get("completions"), row.get("labels")
    if not isinstance(steps, list):
        raise ValueError(f"field 'completions' must be a list of step strings, got {type(steps).__name__}")
    if not isinstance(labels, list):
        raise ValueError(f"field 'labels' must be a list of numbers, got {type(labels).__name__}")
    if not steps:
        raise ValueError("zero steps")
    if len(labels) != len(steps):
        raise ValueError(f"{len(steps)} completions but {len(labels)} labels")
    for j, step in enumerate(steps):
        if not isinstance(step, str) or not step.strip():
            raise ValueError(f"step {j} is empty or not a string")
    try:
        validate_paths([prompt], [steps])
    except VerifierInputError as err:
        raise ValueError(str(err).removeprefix("row 0: ")) from None
    values = []
    for j, label in enumerate(labels):
        if isinstance(label, bool):
            label = float(label)
        if not isinstance(label, (int, float)):
            raise ValueError(f"labels[{j}] = {label!r} is not a number")
        if not math.isfinite(label) or not 0.0 <= label <= 1.0:
            raise ValueError(f"labels[{j}] = {label!r} is outside [0, 1]")
        values.append(float(label))
    return prompt, steps, values


def validate_rows(
    rows: Sequence[Any],
    skip_bad_rows: bool = False,
    source: str | None = None,
    lines: Sequence[int] | None = None,
) -> tuple[list[dict], list[dict]]:
    """(clean rows {id, prompt, completions, labels}, bad rows {index, id, reason}).

    A bad row raises BadRowError naming it, unless `skip_bad_rows`, when it is listed and skipped.
    """
    clean, bad = [], []
    for i, row in enumerate(rows):
        try:
            prompt, steps, labels = check_row(row)
        except ValueError as err:
            name = row_name(i, row, lines[i] if lines else None, source)
            if not skip_bad_rows:
                raise BadRowError(f"{name}: {err}") from None
            bad.append({"index": i, "id": row.get("id") if isinstance(row, dict) else None, "reason": str(err)})
            continue
        rid = row.get("id")
        clean.append({"id": str(rid) if rid is not None else str(i), "index": i, "prompt": prompt,
                      "completions": [s.strip() for s in steps], "labels": labels})
    return clean, bad


def check_lengths(
    rows: list[dict], tokenizer, max_length: int | None, skip_bad_rows: bool = False,
    source: str | None = None, lines: Sequence[int] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Rows that fit `max_length` tokens in the scoring layout; a longer row is an error naming it."""
    if max_length is None or not rows:
        return rows, []
    texts = [layout(r["prompt"], r["completions"]).text for r in rows]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    keep, bad = [], []
    for row, n in zip(rows, lengths):
        if n <= max_length:
            keep.append(row)
            continue
        reason = f"{n} tokens, longer than the model's context ({max_length})"
        if not skip_bad_rows:
            i = row["index"]
            raise BadRowError(f"{row_name(i, row, lines[i] if lines else None, source)}: {reason}")
        bad.append({"index": row["index"], "id": row["id"], "reason": reason})
    return keep, bad


def step_weights(labels: Sequence[Sequence[float]], outcome_only: bool = False,
                 label_balance: bool = False) -> list[list[float]]:
    """The loss weight of every step: 1 (0 before the last step when `outcome_only`), and with
    `label_balance`, N / (2 N_neg) for steps labelled < 0.5 and N / (2 N_pos) for the others, so
    the two groups carry equal total weight (the sum stays N). With one group absent, no reweighting."""
    mask = [[1.0 if (not outcome_only or j == len(ls) - 1) else 0.0 for j in range(len(ls))] for ls in labels]
    if not label_balance:
        return mask
    n_pos = sum(1 for ls, ms in zip(labels, mask) for y, m in zip(ls, ms) if m and y >= 0.5)
    n_neg = sum(1 for ls, ms in zip(labels, mask) for y, m in zip(ls, ms) if m and y < 0.5)
    if n_pos == 0 or n_neg == 0:
        logger.warning("label_balance: only one label group (< 0.5 or >= 0.5) is present; no reweighting")
        return mask
    total = n_pos + n_neg
    w_pos, w_neg = total / (2 * n_pos), total / (2 * n_neg)
    return [[m * (w_pos if y >= 0.5 else w_neg) for y, m in zip(ls, ms)] for ls, ms in zip(labels, mask)]


class PSVCollator:
    """Stepwise rows -> right-padded `input_ids`, `attention_mask`, and per-token `step_targets` /
    `step_weights` that are zero except at the token ending each step (from `encode_paths`)."""

    def __init__(self, tokenizer, max_length: int | None = None):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        questions = [f["prompt"] for f in features]
        paths = [f["completions"] for f in features]
        batch, positions = encode_paths(self.tokenizer, questions, paths, self.max_length)
        targets = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
        weights = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
        for row, (feature, pos) in enumerate(zip(features, positions)):
            w = feature.get("weights") or [1.0] * len(pos)
            targets[row, pos] = torch.tensor(feature["labels"], dtype=torch.float32)
            weights[row, pos] = torch.tensor(w, dtype=torch.float32)
        return {**batch, "step_targets": targets, "step_weights": weights}


def psv_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, loss: str = "mse") -> torch.Tensor:
    """Weighted mean over step ends of the per-step loss; `logits`, `targets`, `weights` are [batch, tokens]."""
    logits = logits.float()
    if loss == "mse":
        per_token = (torch.sigmoid(logits) - targets) ** 2
    elif loss == "bce":
        per_token = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    else:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return (per_token * weights).sum() / weights.sum().clamp_min(1e-8)


class PSVTrainer(Trainer):
    """A Trainer whose loss is the PSV's step-end loss (`psv_loss`) instead of the model's own."""

    def __init__(self, *args, loss_type: str = "mse", **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_type = loss_type
        self.model_accepts_loss_kwargs = False  # our loss is a per-batch mean; let Trainer scale it

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        loss = psv_loss(outputs.logits.squeeze(-1), inputs["step_targets"], inputs["step_weights"], self.loss_type)
        return (loss, outputs) if return_outputs else loss


# ---------------------------------------------------------------------------------------------
# Models.


def _local_abspath(path: str) -> str:
    """The absolute path of a local directory; a Hub id stays as it is."""
    return os.path.abspath(path) if os.path.exists(path) else path


def init_kind(path: str) -> str:
    """'lora_psv', 'psv' (a full token-classification PSV) or 'policy' (a causal LM)."""
    from transformers import AutoConfig

    p = Path(path)
    if (p / "adapter_config.json").exists():
        return "lora_psv"
    if (p / "psv_config.json").exists():
        return "psv"
    archs = getattr(AutoConfig.from_pretrained(path), "architectures", None) or []
    return "psv" if any(a.endswith("ForTokenClassification") for a in archs) else "policy"


def _checkpoint_keys(path: str) -> set[str] | None:
    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.exists():
        return set(json.loads(index.read_text())["weight_map"])
    single = p / "model.safetensors"
    if single.exists():
        from safetensors import safe_open

        with safe_open(str(single), "pt") as fh:
            return set(fh.keys())
    return None


def new_weights(policy_path: str, model) -> list[str] | None:
    """Parameters of a PSV freshly built from a policy that its checkpoint does not hold.

    transformers warns that these were newly initialised; only the head (`score.*`) should be.
    Reads the safetensors headers only; None when the checkpoint is not local safetensors.
    """
    keys = _checkpoint_keys(policy_path)
    if keys is None:
        return None
    missing = sorted(k for k in model.state_dict() if k not in keys)
    if len(missing) == len(model.state_dict()):
        raise RuntimeError(f"no weight of {policy_path} matched the PSV's parameter names: the backbone did not load")
    backbone = [k for k in missing if not k.startswith(HEAD_PREFIX)]
    if backbone:
        logger.warning(
            "%d backbone parameters of the PSV are not in %s under the same name (renamed on load, or "
            "newly initialised): %s", len(backbone), policy_path, ", ".join(backbone[:5]))
    else:
        logger.info("only the PSV head (%s) is newly initialised, as expected", ", ".join(missing))
    return missing


def load_for_training(args: PSVArguments) -> tuple[Any, Any, dict]:
    """(model ready to train, tokenizer, facts for psv_config.json) from `args.init_from`."""
    from transformers import AutoModelForTokenClassification

    init_from = _local_abspath(args.init_from)
    kind = init_kind(init_from)
    facts: dict[str, Any] = {"init_from": init_from, "init_kind": kind}
    base_path = init_from
    if kind == "policy":
        model, tokenizer = init_psv_from_policy(init_from)
        facts["new_weights"] = new_weights(init_from, model)
    elif kind == "psv":
        model, tokenizer = load_psv_model(init_from)
    else:
        from peft import PeftModel

        base_path = json.loads((Path(init_from) / "adapter_config.json").read_text())["base_model_name_or_path"]
        if args.lora:  # keep training the same adapter over the same base
            _, tokenizer = load_psv_model(init_from)
            base = AutoModelForTokenClassification.from_pretrained(base_path, num_labels=1)
            base.config.pad_token_id = tokenizer.pad_token_id
            model = PeftModel.from_pretrained(base, init_from, is_trainable=True)
        else:  # full training from the merged adapter
            model, tokenizer = load_psv_model(init_from)
            model = model.merge_and_unload().requires_grad_(True)  # loaded for inference: frozen
    if model.config.num_labels != 1:
        raise ValueError(f"{init_from}: a PSV has one label, this model has {model.config.num_labels}")
    if args.lora and kind != "lora_psv":
        from peft import LoraConfig, TaskType, get_peft_model

        targets = args.lora_target_modules
        if targets and targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        config = LoraConfig(
            task_type=TaskType.TOKEN_CLS, r=args.lora_r, lora_alpha=args.lora_alpha or 2 * args.lora_r,
            lora_dropout=args.lora_dropout, target_modules=targets, modules_to_save=["score"],
        )
        model = get_peft_model(model, config)
    if args.lora:
        for cfg in model.peft_config.values():
            cfg.base_model_name_or_path = base_path
        active = model.peft_config[model.active_adapter]
        facts.update(base_model=base_path, lora_r=active.r, lora_alpha=active.lora_alpha)
    return model, tokenizer, facts


# ---------------------------------------------------------------------------------------------
# Training.


def data_stats(rows: list[dict], bad: list[dict], outcome_only: bool) -> dict[str, Any]:
    labels = [y for r in rows for y in r["labels"]]
    supervised = [r["labels"][-1] for r in rows] if outcome_only else labels
    return {
        "rows": len(rows),
        "steps": len(labels),
        "mean_steps": len(labels) / max(len(rows), 1),
        "label_mean": sum(labels) / max(len(labels), 1),
        "frac_label_ge_0.5": sum(y >= 0.5 for y in labels) / max(len(labels), 1),
        "supervised_steps": len(supervised),
        "supervised_label_mean": sum(supervised) / max(len(supervised), 1),
        "skipped_rows": len(bad),
        "bad_rows": bad[:50],
    }


@torch.no_grad()
def probe_loss(model, collator: PSVCollator, rows: list[dict], loss: str, batch_size: int) -> float | None:
    """The training loss (weighted over steps) on `rows`, without gradients."""
    if not rows:
        return None
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, weight = 0.0, 0.0
    for start in range(0, len(rows), batch_size):
        batch = collator(rows[start : start + batch_size])
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
        w = batch["step_weights"].sum().item()
        total += psv_loss(logits, batch["step_targets"], batch["step_weights"], loss).item() * w
        weight += w
    model.train(was_training)
    return total / max(weight, 1e-8)


def run(rows: Sequence[Any], args: PSVArguments, training_args: PSVTrainingConfig,
        source: str | None = None, lines: Sequence[int] | None = None) -> dict[str, Any]:
    """Validate `rows`, train the PSV, save it to `training_args.output_dir`; returns the summary."""
    from datasets import Dataset
    from transformers import enable_full_determinism, set_seed

    if not args.init_from:
        raise ValueError("init_from is required: a policy or a PSV to start from")
    check_model_path("--init_from", args.init_from)
    start = time.time()
    clean, bad = validate_rows(rows, args.skip_bad_rows, source, lines)
    # seeded before any weight exists: the new score head is drawn when the model is built, before
    # the Trainer seeds, so two runs of the same command would otherwise differ
    if training_args.full_determinism:
        enable_full_determinism(training_args.seed)
    else:
        set_seed(training_args.seed)
    model, tokenizer, facts = load_for_training(args)
    max_length = args.max_length or getattr(model.config, "max_position_embeddings", None)
    clean, too_long = check_lengths(clean, tokenizer, max_length, args.skip_bad_rows, source, lines)
    bad = sorted(bad + too_long, key=lambda b: b["index"])
    if not clean:
        raise ValueError("no trainable rows" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    weights = step_weights([r["labels"] for r in clean], args.outcome_only, args.label_balance)
    train_rows = [{"id": r["id"], "prompt": r["prompt"], "completions": r["completions"], "labels": r["labels"],
                   "weights": w} for r, w in zip(clean, weights)]
    dataset = Dataset.from_list(train_rows)
    collator = PSVCollator(tokenizer, max_length)
    trainer = PSVTrainer(model=model, args=training_args, train_dataset=dataset, data_collator=collator,
                         processing_class=tokenizer, loss_type=args.loss)
    probe = random.Random(training_args.seed).sample(train_rows, min(args.loss_probe_rows, len(train_rows)))
    can_probe = not training_args.deepspeed  # ZeRO-3 shards parameters outside the engine
    batch = training_args.per_device_train_batch_size
    loss_before = probe_loss(trainer.model, collator, probe, args.loss, batch) if can_probe else None
    output = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    train_seconds = time.time() - start
    loss_after = probe_loss(trainer.model, collator, probe, args.loss, batch) if can_probe else None
    out = Path(training_args.output_dir)
    stats = data_stats(clean, bad, args.outcome_only)
    summary = {
        "rows": stats["rows"], "steps": stats["steps"], "label_mean": round(stats["label_mean"], 4),
        "skipped_rows": len(bad), "train_loss": output.training_loss, "loss_before": loss_before,
        "loss_after": loss_after, "global_steps": output.global_step, "train_seconds": round(train_seconds, 2),
        "output_dir": str(out),
    }
    trainer.save_model(str(out))
    if trainer.is_world_process_zero():
        _save_psv_files(out, tokenizer, args, training_args, facts, max_length, source, stats, output,
                        round(train_seconds, 2), {"rows": len(probe), "before": loss_before, "after": loss_after})
    return summary


def _save_psv_files(out: Path, tokenizer, args: PSVArguments, training_args: PSVTrainingConfig, facts: dict,
                    max_length, source: str | None, stats: dict, output, train_seconds: float,
                    loss_probe: dict) -> None:
    """Beside the saved weights: the tokenizer, a LoRA adapter's base model, and `psv_config.json`
    (the format, the loss, the data's statistics, the training and the loss probe)."""
    tokenizer.save_pretrained(str(out))
    if args.lora:
        adapter_config = out / "adapter_config.json"
        config = json.loads(adapter_config.read_text())
        config["base_model_name_or_path"] = facts["base_model"]
        config["modules_to_save"] = list(dict.fromkeys(config.get("modules_to_save") or []))
        adapter_config.write_text(json.dumps(config, indent=2))
    psv_config = {
        "format": "steprl-psv",
        "loss": args.loss,
        "outcome_only": args.outcome_only,
        "label_balance": args.label_balance,
        "lora": args.lora,
        "max_length": max_length,
        **facts,
        "data": {"source": source, **stats},
        "training": {
            "learning_rate": training_args.learning_rate,
            "num_train_epochs": training_args.num_train_epochs,
            "max_steps": training_args.max_steps,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "seed": training_args.seed,
            "global_steps": output.global_step,
            "train_loss": output.training_loss,
            "train_seconds": train_seconds,
        },
        "loss_probe": loss_probe,
    }
    (out / "psv_config.json").write_text(json.dumps(psv_config, indent=2))


def train_verifier(
    rows: list[dict],
    init_from: str,
    output_dir: str,
    *,
    loss: str = "mse",
    outcome_only: bool = False,
    lora: bool = False,
    lora_r: int = 16,
    num_train_epochs: float = 1.0,
    learning_rate: float = 1e-3,
    per_device_train_batch_size: int = 16,
    seed: int = 0,
    report_to: str = "none",
    max_steps: int = -1,
    label_balance: bool = False,
    skip_bad_rows: bool = False,
    max_length: int | None = None,
    training_args: dict[str, Any] | None = None,
) -> str:
    """Train a PSV on stepwise `rows` starting from `init_from` (a policy or a PSV); returns output_dir.

    `training_args` holds any further TrainingArguments fields (logging_steps, warmup_steps, ...).
    Raises BadRowError naming the first bad row, unless `skip_bad_rows`.
    """
    args = PSVArguments(init_from=init_from, loss=loss, outcome_only=outcome_only, label_balance=label_balance,
                        lora=lora, lora_r=lora_r, skip_bad_rows=skip_bad_rows, max_length=max_length)
    extra = {"disable_tqdm": True, **(training_args or {})}
    config = PSVTrainingConfig(
        output_dir=output_dir, num_train_epochs=num_train_epochs, learning_rate=learning_rate,
        per_device_train_batch_size=per_device_train_batch_size, seed=seed, report_to=report_to,
        max_steps=max_steps, **extra,
    )
    run(rows, args, config)
    return output_dir


# ---------------------------------------------------------------------------------------------
# CLI.


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    one_thread_unless_told()  # torch read the thread count at import
    parser = TrlParser((PSVArguments, PSVTrainingConfig))
    try:
        args, training_args = parser.parse_args_and_config(args=argv)
        if not args.data or not args.init_from:
            raise ValueError("--data and --init_from are required")
        rows, lines = read_jsonl(args.data)
        summary = run(rows, args, training_args, source=args.data, lines=lines)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from accelerate import PartialState

    if PartialState().is_main_process:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
