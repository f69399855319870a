"""PRIME's implicit process reward model, learned from the policy's own samples and the answer check.

    python -m reward_models.implicit_prm --data A.jsonl --init_from POLICY --output_dir PRM
        [--beta 0.05] [--learning_rate 1e-5] [--num_train_epochs 1] [--batch_size 8] [--max_steps N]

An implicit PRM is a causal LM pi_theta, initialised from the policy, read against a frozen
reference pi_ref (the policy itself). Its reward for a response y to a prompt x is

    r(x, y) = beta * sum_t log(pi_theta(y_t | x, y<t) / pi_ref(y_t | x, y<t))

and it is trained as an outcome model: binary cross-entropy of sigmoid(r(x, y)) against the answer
check's label l in {0, 1} of each sampled response. No step label and no clean-teacher data are
needed, only what a user has: the policy's own samples and the answer check
(`python -m reward_models.annotate --method outcome` writes them; any annotation output works,
since every row carries `answer_correct`).

Its process reward comes for free: the reward of step j is beta times the sum of the log-ratios of
the tokens of step j (`ImplicitPRM.step_rewards`), and the step rewards of a path add up to r(x, y).
As a `Verifier` (spec `implicit:PATH`), a step's score is sigmoid of the *cumulative* implicit
reward up to and including that step: PRIME's value of the prefix, the model's probability that
the path so far ends in a correct answer (the last step's score is sigmoid(r(x, y)), exactly the
quantity trained). A probability in [0, 1] is what Best-of-N, StepCo and the PPO rewards read;
with `--reward_shaping delta` PPO pays each step the change of this value.

Tokens: a path is read in the verifier layout (`reward_models.verifier.layout`). Step j owns the
tokens from the one covering the first character of its `<Step>` tag up to (not including) the one
covering the next step's; the last step owns every token to the end of the text. Every token after
the prompt belongs to exactly one step, and padding to none.

`ImplicitPRM.online_update` takes one (or a few) optimiser steps on a PPO update's rollouts and
their answer-check labels, so that the PRM follows the policy (PRIME's online update; the PPO flag
`--verifier_online_update`).

The trained folder holds the LM (`save_pretrained`), its tokenizer and `implicit_prm.json` with
beta, the reference and the training figures (with the loss logged every `--logging_steps`). A
local reference is stored as a path relative to the PRM folder (`reference_local: true`), so a tree
that holds both moves as a whole, with its absolute path beside it (`reference_absolute`) for a PRM
folder moved alone; a Hub id is stored as is. A file from before (an absolute path) still loads.

Training shows a progress bar and writes to stderr, as JSON lines, the label balance at the start
(rows, right and wrong, and the answer check they were made with when the annotation's
`<data>.meta.json` says so) and the mean loss every `--logging_steps` steps; stdout is the summary.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.model_files import check_model_path
from reasoning.benchmarks import DatasetError
from reasoning.jsonl import read_jsonl
from reasoning.threads import one_thread_unless_told
from reasoning.world import carry_world_files
from reward_models.train import BadRowError, check_lengths, row_name
from reward_models.verifier import VerifierInputError, layout, token_positions, validate_paths

CONFIG_NAME = "implicit_prm.json"
FORMAT = "steprl-implicit-prm"


# ---------------------------------------------------------------------------------------------
# The folder: checks that need no weights.


def check_implicit_dir(path: str) -> dict[str, Any]:
    """The folder's `implicit_prm.json`; ValueError (one line) unless `path` is an implicit PRM
    folder whose reference exists."""
    p = Path(path)
    if not path:
        raise ValueError("implicit: name the implicit PRM folder (implicit:PATH)")
    if not p.is_dir():
        raise ValueError(f"implicit:{path}: no such directory; train one with "
                         f"`python -m reward_models.implicit_prm --output_dir {path} ...`")
    cfg_path = p / CONFIG_NAME
    if not cfg_path.is_file():
        raise ValueError(f"implicit:{path}: no {CONFIG_NAME} (not an implicit PRM folder from "
                         "`python -m reward_models.implicit_prm`)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"implicit:{path}: {CONFIG_NAME} is not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("beta"), (int, float)) or not cfg.get("reference"):
        raise ValueError(f"implicit:{path}: {CONFIG_NAME} needs a number 'beta' and a 'reference' path")

    ref = resolve_reference(path, cfg)
    try:
        check_model_path("reference", ref)  # a saved model's folder, or a Hub id
    except ValueError:
        raise ValueError(f"implicit:{path}: its reference {ref} is missing or not a saved model; "
                         f"put the policy back there or fix 'reference' in {cfg_path}") from None
    return cfg


def resolve_reference(path: str, cfg: dict[str, Any]) -> str:
    """The reference of the PRM folder `path` whose `implicit_prm.json` is `cfg`: a local one
    (`reference_local`) relative to the folder, else at its stored absolute path when only the PRM
    moved (the relative one, to name in an error, when neither is there); a file from before the
    flag: a path relative to the folder when one is there, else as saved (an absolute path, or a
    Hub id)."""
    reference = str(cfg["reference"])
    if Path(reference).is_absolute():
        return reference
    inside = os.path.normpath(Path(path) / reference)
    if cfg.get("reference_local"):
        fallback = cfg.get("reference_absolute")
        if not Path(inside).exists() and isinstance(fallback, str) and Path(fallback).exists():
            return fallback
        return inside
    return inside if Path(inside).exists() else reference


def stored_reference(reference: str, out: str | os.PathLike[str]) -> dict[str, Any]:
    """How `implicit_prm.json` in the folder `out` names the reference `reference` (a local path,
    relative to the working directory, or a Hub id): see the module docstring."""
    if not reference or not Path(reference).exists():
        return {"reference": reference}  # a Hub id
    absolute = os.path.abspath(reference)
    try:
        relative = os.path.relpath(absolute, os.path.abspath(out))
    except ValueError:  # another drive: no relative path
        return {"reference": absolute}
    return {"reference": Path(relative).as_posix(), "reference_local": True, "reference_absolute": absolute}


# ---------------------------------------------------------------------------------------------
# Encoding: which tokens belong to which step.


def encode_steps(tokenizer, questions: Sequence[str], paths: Sequence[Sequence[str]],
                 max_length: int | None = None, row_offset: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask` and `token_step` [B, T]: the step that owns each
    token (-1 for the prompt and padding; see the module docstring)."""
    validate_paths(questions, paths)
    encoded, owners = [], []
    for i, (question, steps) in enumerate(zip(questions, paths)):
        lay = layout(question, steps)
        enc = tokenizer(lay.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = enc["input_ids"]
        if max_length is not None and len(ids) > max_length:
            raise VerifierInputError(
                f"row {row_offset + i}: {len(ids)} tokens, longer than the implicit PRM's context ({max_length})")
        starts = [lay.text.rindex("<Step>", 0, end) for end in lay.step_end_chars]
        first = token_positions(enc["offset_mapping"], starts)
        owner = [-1] * len(ids)
        bounds = [*first, len(ids)]
        for j in range(len(steps)):
            for k in range(max(bounds[j], 1), bounds[j + 1]):  # token 0 has no prediction
                owner[k] = j
        encoded.append(ids)
        owners.append(owner)
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    token_step = torch.full((len(encoded), width), -1, dtype=torch.long)
    for r, (ids, owner) in enumerate(zip(encoded, owners)):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        attention_mask[r, : len(ids)] = 1
        token_step[r, : len(ids)] = torch.tensor(owner)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_step": token_step}


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log-probability of each token given those before it (column 0 is 0: no prediction)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def step_sums(per_token: torch.Tensor, token_step: torch.Tensor, n_steps: int) -> torch.Tensor:
    """[B, n_steps]: the sum of `per_token` over the tokens each step owns (others ignored)."""
    owned = token_step >= 0
    out = torch.zeros((per_token.shape[0], n_steps + 1), dtype=per_token.dtype, device=per_token.device)
    index = torch.where(owned, token_step, torch.full_like(token_step, n_steps))
    out = out.scatter_add(1, index, per_token * owned.to(per_token.dtype))
    return out[:, :n_steps]


def implicit_loss(rewards: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean BCE of sigmoid(r(x, y)) against the outcome labels; `rewards` are the whole-path r."""
    return torch.nn.functional.binary_cross_entropy_with_logits(rewards, labels.to(rewards.dtype))


# ---------------------------------------------------------------------------------------------
# The verifier.


class ImplicitPRM:
    """The `Verifier` of an implicit PRM: `model` (pi_theta, trainable) against `ref` (frozen)."""

    def __init__(self, model, ref, tokenizer, beta: float, batch_size: int = 32,
                 max_length: int | None = None):
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.model = model.eval()
        self.ref = ref.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.beta = float(beta)
        self.batch_size = batch_size
        self.max_length = max_length or getattr(model.config, "max_position_embeddings", None)
        self.tokens_used = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.path: str | None = None
        self.reference_path: str | None = None

    @classmethod
    def from_pretrained(cls, path: str, batch_size: int = 32, device: str | None = None) -> ImplicitPRM:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg = check_implicit_dir(path)
        ref_path = resolve_reference(path, cfg)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = AutoModelForCausalLM.from_pretrained(path).to(device)
        ref = AutoModelForCausalLM.from_pretrained(ref_path).to(device)
        prm = cls(model, ref, tokenizer, cfg["beta"], batch_size=batch_size)
        prm.path, prm.reference_path = str(path), ref_path
        return prm

    # --- reading ------------------------------------------------------------------------------

    def _rewards_of_batch(self, batch: dict[str, torch.Tensor], n_steps: int) -> torch.Tensor:
        """[B, n_steps] step rewards, differentiable in `model` (the reference has no gradient)."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            ref_lp = token_logprobs(self.ref, ids, mask)
        lp = token_logprobs(self.model, ids, mask)
        return self.beta * step_sums(lp - ref_lp, batch["token_step"], n_steps)

    def _batches(self, questions, paths):
        device = next(self.model.parameters()).device
        for start in range(0, len(paths), self.batch_size):
            qs, ps = questions[start : start + self.batch_size], paths[start : start + self.batch_size]
            batch = encode_steps(self.tokenizer, qs, ps, self.max_length, row_offset=start)
            self.tokens_used += 2 * int(batch["attention_mask"].sum())  # two models read every token
            yield ps, {k: v.to(device) for k, v in batch.items()}

    @torch.no_grad()
    def step_rewards(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        """For each path, the implicit process reward of each step: beta * the sum of its tokens'
        log-likelihood ratios against the reference."""
        validate_paths(questions, paths)
        was_training = self.model.training
        self.model.eval()
        out: list[list[float]] = []
        for ps, batch in self._batches(questions, paths):
            rewards = self._rewards_of_batch(batch, max(len(p) for p in ps))
            out.extend(rewards[r, : len(p)].tolist() for r, p in enumerate(ps))
        self.model.train(was_training)
        return out

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        """For each path, sigmoid of the cumulative implicit reward up to each step (in [0, 1])."""
        return [[1.0 / (1.0 + math.exp(-c)) for c in _cumsum(r)] for r in self.step_rewards(questions, paths)]

    # --- learning -----------------------------------------------------------------------------

    def loss(self, questions: Sequence[str], paths: Sequence[Sequence[str]], labels: Sequence[float]) -> torch.Tensor:
        """The training loss (BCE of sigmoid(r) against `labels`) on one batch, with gradients."""
        batch = encode_steps(self.tokenizer, questions, paths, self.max_length)
        device = next(self.model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        self.tokens_used += 2 * int(batch["attention_mask"].sum())
        rewards = self._rewards_of_batch(batch, max(len(p) for p in paths)).sum(-1)
        return implicit_loss(rewards, torch.tensor([float(y) for y in labels], device=device))

    def online_update(self, questions: Sequence[str], paths: Sequence[Sequence[str]], labels: Sequence[float], *,
                      steps: int = 1, learning_rate: float = 1e-6, batch_size: int | None = None,
                      grad_sync: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """`steps` AdamW steps of the PRM on these rollouts (each a pass over them in `batch_size`
        chunks, gradients accumulated, one optimiser step). `grad_sync` (e.g. a mean over processes)
        is applied to each gradient before the step, so that replicas stay identical. The reference
        is never touched. Returns the loss before the first step and the seconds taken."""
        start = time.time()
        validate_paths(questions, paths)
        if len(labels) != len(paths):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        chunk = batch_size or self.batch_size
        self.model.train()
        first_loss = None
        for _ in range(steps):
            self.optimizer.zero_grad()
            total = 0.0
            for s in range(0, len(paths), chunk):
                part = slice(s, s + chunk)
                loss = self.loss(questions[part], paths[part], labels[part])
                (loss * len(paths[part]) / len(paths)).backward()
                total += loss.item() * len(paths[part]) / len(paths)
            if grad_sync is not None:
                for p in params:
                    if p.grad is not None:
                        p.grad.copy_(grad_sync(p.grad))
            self.optimizer.step()
            first_loss = total if first_loss is None else first_loss
        self.optimizer.zero_grad()
        self.model.eval()
        return {"loss": float(first_loss or 0.0), "seconds": time.time() - start, "paths": float(len(paths))}

    def online_state(self) -> dict[str, Any]:
        """The weights and optimiser state of online updates, for a checkpoint."""
        return {"model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}

    def load_online_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if state.get("optimizer") is not None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, weight_decay=0.0)
            self.optimizer.load_state_dict(state["optimizer"])

    def save_pretrained(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """The LM, its tokenizer and `implicit_prm.json` (beta, the reference): loadable as implicit:PATH."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out))
        self.tokenizer.save_pretrained(str(out))
        reference = self.reference_path or getattr(self.ref, "name_or_path", "") or ""
        cfg = {"format": FORMAT, "beta": self.beta, **stored_reference(reference, out), **(extra or {})}
        (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=2))


def _cumsum(values: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def find_implicit(verifier) -> list[ImplicitPRM]:
    """The implicit PRMs in `verifier`: itself, or the parts of a combined verifier."""
    if isinstance(verifier, ImplicitPRM):
        return [verifier]
    return [p for p in getattr(verifier, "parts", []) if isinstance(p, ImplicitPRM)]


# ---------------------------------------------------------------------------------------------
# Training from sampled, answer-checked paths.


def outcome_label(row: dict) -> float:
    """The row's answer-check label: `answer_correct` (true/false, or 0/1); ValueError otherwise."""
    value = row.get("answer_correct")
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return float(value)
    raise ValueError(f"field 'answer_correct' must be true/false (the answer check), got {value!r}")


def check_outcome_rows(rows: Sequence[Any], skip_bad_rows: bool = False, source: str | None = None,
                       lines: Sequence[int] | None = None) -> tuple[list[dict], list[dict]]:
    """(clean rows {id, prompt, completions, label}, bad rows {index, id, reason}); a bad row
    raises BadRowError naming the file and line unless `skip_bad_rows`."""

    clean, bad = [], []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
            prompt, steps = row.get("prompt"), row.get("completions")
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError("field 'prompt' must be a non-empty string")
            if not isinstance(steps, list):
                raise ValueError(f"field 'completions' must be a list of step strings, got {type(steps).__name__}")
            try:
                validate_paths([prompt], [steps])
            except VerifierInputError as err:
                raise ValueError(str(err).removeprefix("row 0: ")) from None
            label = outcome_label(row)
        except ValueError as err:
            if not skip_bad_rows:
                raise BadRowError(f"{row_name(i, row, lines[i] if lines else None, source)}: {err}") from None
            bad.append({"index": i, "id": row.get("id") if isinstance(row, dict) else None, "reason": str(err)})
            continue
        clean.append({"id": str(row.get("id", i)), "index": i, "prompt": prompt,
                      "completions": [s.strip() for s in steps], "label": label})
    return clean, bad


@dataclass
class ImplicitPRMConfig:
    """Settings of `python -m reward_models.implicit_prm`."""

    data: str | None = field(default=None, metadata={"help": "JSONL of sampled paths: prompt, completions, "
                                                             "answer_correct (reward_models.annotate's rows)."})
    init_from: str | None = field(default=None, metadata={"help": "The policy: the PRM starts from it and it is "
                                                                  "the frozen reference."})
    output_dir: str | None = field(default=None, metadata={"help": "Where the implicit PRM is saved."})
    beta: float = field(default=0.05, metadata={"help": "Scale of the log-likelihood ratio (PRIME: 0.05)."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the data."})
    max_steps: int = field(default=-1, metadata={"help": "Optimiser steps (-1: by epochs)."})
    batch_size: int = field(default=8, metadata={"help": "Paths per optimiser step."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping (0: none)."})
    seed: int = field(default=0, metadata={"help": "Seed of the data order."})
    skip_bad_rows: bool = field(default=False, metadata={"help": "Skip malformed or too-long rows (counted) "
                                                                 "instead of failing."})
    loss_probe_rows: int = field(default=256, metadata={"help": "Rows whose loss is measured before and after."})
    logging_steps: int = field(default=10, metadata={"help": "Log the mean training loss every N optimiser steps "
                                                             "(stderr, and the log history in implicit_prm.json)."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bar."})

    def validate(self) -> None:
        if not self.data or not self.init_from or not self.output_dir:
            raise ValueError("--data, --init_from and --output_dir are required")
        if not self.beta > 0:
            raise ValueError(f"--beta must be > 0, got {self.beta}")
        if self.batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ValueError(f"--learning_rate must be > 0, got {self.learning_rate}")
        if self.logging_steps < 1:
            raise ValueError(f"--logging_steps must be >= 1, got {self.logging_steps}")


def load_for_training(policy: str, beta: float) -> ImplicitPRM:
    """An implicit PRM at initialisation: pi_theta a trainable copy of the policy, pi_ref the policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(policy).to(device)
    ref = AutoModelForCausalLM.from_pretrained(policy).to(device)
    prm = ImplicitPRM(model, ref, tokenizer, beta)
    prm.reference_path = os.path.abspath(policy) if Path(policy).exists() else policy
    return prm


def labels_answer_match(source: str | None) -> str | None:
    """The answer check the rows of the file `source` were labelled with, from the annotation's
    `<source>.meta.json` (`--answer_match`, recorded only when not "strict"); None when there is none."""
    meta = Path(f"{source}.meta.json") if source else None
    if meta is None or not meta.is_file():
        return None
    try:
        settings = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    return str(settings.get("answer_match", "strict")) if isinstance(settings, dict) else None


def log_line(record: dict[str, Any]) -> None:
    """One JSON line of training progress on stderr (stdout is the summary), past a progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(json.dumps(record), file=sys.stderr)


@torch.no_grad()
def probe_loss(prm: ImplicitPRM, rows: list[dict], batch_size: int) -> float | None:
    if not rows:
        return None
    total = 0.0
    for s in range(0, len(rows), batch_size):
        part = rows[s : s + batch_size]
        loss = prm.loss([r["prompt"] for r in part], [r["completions"] for r in part], [r["label"] for r in part])
        total += loss.item() * len(part)
    return total / len(rows)


def _log_start(rows: int, right: int, answer_match: Any, skipped: int, steps: int, batch_size: int) -> None:
    """The start line, and a warning when every row carries the same label."""
    log_line({"implicit_prm": "start", "rows": rows, "right": right, "wrong": rows - right,
              "label_mean": round(right / rows, 4), "answer_match": answer_match, "skipped_rows": skipped,
              "steps": steps, "batch_size": batch_size})
    if right in (0, rows):
        log_line({"warning": f"every row is labelled {'right' if right else 'wrong'}: the PRM can only learn to "
                             "say so (check the annotation's --answer_match and the policy's answers)"})


def _optimise(prm, clean: list[dict], cfg: ImplicitPRMConfig, rng: random.Random, total_steps: int,
              start: float) -> tuple[list[float], list[dict[str, Any]]]:
    """`total_steps` AdamW steps on the outcome loss over shuffled epochs of `clean`, logged every
    `logging_steps`; returns every step's loss and the log entries. Leaves the model in eval mode."""
    params = [p for p in prm.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    prm.model.train()
    order: list[dict] = []
    losses: list[float] = []
    log_history: list[dict[str, Any]] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=total_steps, desc="implicit PRM", disable=cfg.disable_tqdm, dynamic_ncols=True)
    for step in range(1, total_steps + 1):
        if len(order) < cfg.batch_size:
            epoch = list(clean)
            rng.shuffle(epoch)
            order += epoch
        part, order = order[: cfg.batch_size], order[cfg.batch_size :]
        loss = prm.loss([r["prompt"] for r in part], [r["completions"] for r in part], [r["label"] for r in part])
        optimizer.zero_grad()
        loss.backward()
        if cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        bar.update(1)
        if step % cfg.logging_steps == 0 or step == total_steps:
            recent = losses[-(step - (log_history[-1]["step"] if log_history else 0)):]
            entry = {"step": step, "of": total_steps, "loss": round(sum(recent) / len(recent), 6),
                     "epoch": round(step * cfg.batch_size / len(clean), 4), "seconds": round(time.time() - start, 2)}
            log_history.append(entry)
            log_line(entry)
            bar.set_postfix(loss=f"{entry['loss']:.4f}")
    bar.close()
    prm.model.eval()
    return losses, log_history


def train_implicit_prm(rows: Sequence[Any], cfg: ImplicitPRMConfig, source: str | None = None,
                       lines: Sequence[int] | None = None) -> dict[str, Any]:
    """Validate `rows`, train the implicit PRM from `cfg.init_from`, save it; returns the summary."""

    cfg.validate()
    check_model_path("--init_from", cfg.init_from)
    start = time.time()
    clean, bad = check_outcome_rows(rows, cfg.skip_bad_rows, source, lines)
    torch.manual_seed(cfg.seed)
    prm = load_for_training(cfg.init_from, cfg.beta)
    clean, too_long = check_lengths(clean, prm.tokenizer, prm.max_length, cfg.skip_bad_rows, source, lines)
    bad = sorted(bad + too_long, key=lambda b: b["index"])
    if not clean:
        raise ValueError("no trainable rows" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    rng = random.Random(cfg.seed)
    probe = rng.sample(clean, min(cfg.loss_probe_rows, len(clean)))
    per_epoch = math.ceil(len(clean) / cfg.batch_size)
    total_steps = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(per_epoch * cfg.num_train_epochs))
    right = int(sum(r["label"] for r in clean))
    answer_match = labels_answer_match(source)
    _log_start(len(clean), right, answer_match, len(bad), total_steps, cfg.batch_size)
    loss_before = probe_loss(prm, probe, cfg.batch_size)
    tokens_before = prm.tokens_used
    losses, log_history = _optimise(prm, clean, cfg, rng, total_steps, start)
    train_tokens = prm.tokens_used - tokens_before
    loss_after = probe_loss(prm, probe, cfg.batch_size)
    seconds = round(time.time() - start, 2)
    stats = {"rows": len(clean), "correct_rows": right, "label_mean": right / len(clean), "answer_match": answer_match,
             "skipped_rows": len(bad), "bad_rows": bad[:50], "source": source}
    training = {"learning_rate": cfg.learning_rate, "batch_size": cfg.batch_size, "steps": total_steps,
                "num_train_epochs": cfg.num_train_epochs, "max_steps": cfg.max_steps, "seed": cfg.seed,
                "train_loss": sum(losses) / len(losses), "tokens_read": train_tokens, "train_seconds": seconds,
                "logging_steps": cfg.logging_steps, "log_history": log_history}

    prm.save_pretrained(cfg.output_dir, extra={"data": stats, "training": training,
                                               "loss_probe": {"rows": len(probe), "before": loss_before,
                                                              "after": loss_after}})
    carry_world_files(cfg.init_from, cfg.output_dir)  # the PRM reads its policy's world
    return {"rows": len(clean), "label_mean": round(stats["label_mean"], 4), "skipped_rows": len(bad),
            "steps": total_steps, "loss_before": loss_before, "loss_after": loss_after,
            "tokens_read": train_tokens, "train_seconds": seconds, "output_dir": cfg.output_dir}


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    one_thread_unless_told()
    parser = TrlParser((ImplicitPRMConfig,))
    (cfg,) = parser.parse_args_and_config(args=argv)
    try:
        cfg.validate()
        if not Path(cfg.data).is_file():
            raise ValueError(f"--data {cfg.data}: no such file")
        rows, lines = read_jsonl(cfg.data)
        summary = train_implicit_prm(rows, cfg, source=cfg.data, lines=lines)
    except (ValueError, FileNotFoundError, DatasetError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
