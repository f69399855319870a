"""A PPO run's folder belongs to one run: its settings are stored with it, reuse is explicit.

`prepare_run_dir(config)` (the trainer calls it before it writes anything) writes the resolved
settings to OUTPUT_DIR/run_config.json at the start of a fresh run; `check_run_dir(config)` (the
same checks, nothing written; `rl/ppo_step.py` calls it before loading any model) refuses

- a folder this process cannot write in (a probe file, removed at once, tells);
- a fresh run in a folder that is not empty, unless `--overwrite_output_dir` (which clears it; only
  a folder that holds a PPO run is ever cleared), so an old run's checkpoints and metrics never mix
  with a new run's;
- a resume (`--resume_from_checkpoint auto` or a path) whose settings differ from the stored ones,
  except those in `MAY_DIFFER_ON_RESUME`: how long to train, how often to save and log, threads,
  progress bars, evaluation batch sizes and resamples, the length-drift guard's threshold and stop,
  none of which change what an update computes.

`rl.tools.checkpoint_curve` reads run_config.json (`with_stored_settings`), so it needs only `--output_dir`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from reasoning.jsonl import write_jsonl

RUN_CONFIG = "run_config.json"
CHECKPOINT_STATE = "trainer_state.json"
"""The file that makes a `checkpoint-N` folder a checkpoint (`transformers.TrainerState`'s; every
checkpoint has one, the step PPO resume state beside it or, in earlier checkpoints, inside it)."""
RESUME_STATE = "step_ppo_state.json"
"""What a checkpoint adds to accelerate's state to resume: update, KL coefficient (`beta`), reward statistics."""


class _File:
    """A file of a run folder: its name on the class (`RunDir.eval`), its path on a run (`RunDir(d).eval`)."""

    def __init__(self, name: str, doc: str = ""):
        self.file, self.__doc__ = name, doc

    def __get__(self, run: RunDir | None, owner: type | None = None):
        return self.file if run is None else run.root / self.file


class RunDir:
    """The files of a training run's folder, by name: what rl/ppo_step.py writes, and the part of it
    that rl/baselines/grpo_peer.py and rl/baselines/rft.py write too, so that scripts/rl_comparison.py and
    scripts/ppo_report.py read any of them."""

    config = _File(RUN_CONFIG, "The run's resolved settings.")
    metrics = _File("metrics.jsonl", "One JSON line per update (and the probe rows).")
    eval = _File("eval.json", "The result: greedy accuracy before and after, with its paired interval.")
    before_rows = _File("eval_before_rows.jsonl", "The greedy evaluation's rows before training.")
    after_rows = _File("eval_after_rows.jsonl", "The greedy evaluation's rows after training.")
    checkpoint_rows = _File("checkpoint_rows", "The greedy evaluation's rows of each checkpoint, update-N.jsonl "
                                               "(rl.tools.checkpoint_curve).")
    policy = _File("policy", "The trained policy (save_pretrained).")
    critic = _File("critic", "The trained critic (estimator gae).")
    implicit_prm = _File("implicit_prm",
                         "The implicit PRM trained online (--verifier_online_update); more: _1, _2, ...")
    policy_hashes = _File("policy_hashes.json", "Fingerprints of the trained policy's weights.")
    probe_wrong_at_start = _File("probe_wrong_at_start.json", "The probe problems greedy got wrong at the start.")
    trl = _File("trl", "The working folder of a TRL trainer inside the run (the baselines').")

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def greedy_rows(self, which: str) -> dict[str, dict[str, Any]]:
        """The greedy evaluation's rows by problem id, `which` 'before' or 'after' training;
        ValueError when the run has no such file."""
        return rows_by_id({"before": self.before_rows, "after": self.after_rows}[which])

    def correct(self, which: str) -> dict[str, float]:
        """1.0 or 0.0 by problem id: the greedy answer's correctness before or after training."""
        return _correctness(self.greedy_rows(which))

    def update_rows(self, update: int) -> Path:
        """Where rl.tools.checkpoint_curve keeps the greedy evaluation's rows of `checkpoint-{update}`."""
        return self.checkpoint_rows / f"update-{update}.jsonl"

    def correct_at(self, update: int) -> dict[str, float]:
        """1.0 or 0.0 by problem id at `checkpoint-{update}` (rl.tools.checkpoint_curve's rows); ValueError
        when that checkpoint was not evaluated."""
        return _correctness(rows_by_id(self.update_rows(update)))

    # checkpoints: checkpoint-N folders, each written whole under a staging name, then renamed

    def checkpoint(self, update: int) -> Path:
        return self.root / f"checkpoint-{update}"

    def staging(self, update: int) -> Path:
        """Where `checkpoint-{update}` is written before it is renamed into place (a kill leaves no
        half-written checkpoint behind)."""
        return self.root / f".tmp-checkpoint-{update}"

    def checkpoints(self) -> list[Path]:
        """The finished checkpoints, oldest first."""
        found = [p for p in self.root.glob("checkpoint-*") if p.is_dir() and (p / CHECKPOINT_STATE).exists()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def resume_point(self, resume: str | None) -> Path | None:
        """The checkpoint `--resume_from_checkpoint` names: `auto` the latest (None when there is
        none), a path that checkpoint; FileNotFoundError for a path that is not one."""
        if not resume:
            return None
        if resume == "auto":
            found = self.checkpoints()
            return found[-1] if found else None
        path = Path(resume)
        if not (path / CHECKPOINT_STATE).exists():
            raise FileNotFoundError(f"--resume_from_checkpoint {resume}: not a checkpoint (no {CHECKPOINT_STATE})")
        return path

    def write_resume_state(self, folder: Path, state: dict[str, Any]) -> None:
        (folder / RESUME_STATE).write_text(json.dumps(state))

    @staticmethod
    def resume_state(checkpoint: Path) -> dict[str, Any]:
        """What the trainer stored beside accelerate's state (earlier checkpoints kept it in
        trainer_state.json)."""
        own = checkpoint / RESUME_STATE
        state = json.loads((own if own.exists() else checkpoint / CHECKPOINT_STATE).read_text())
        if "kl_coef" in state:  # the KL coefficient's current value, under its name before TRL's
            state["beta"] = state.pop("kl_coef")
        return state

    def write_trainer_state(self, folder: Path, config, update: int) -> None:
        """trainer_state.json as `transformers.TrainerState` writes it (`TrainerState.load_from_json`
        reads it): the update as global_step, the metric lines so far as log_history."""
        from transformers import TrainerState

        history = [{**row, "step": row.get("update", 0)} for row in self.metric_rows(update)]
        state = TrainerState(global_step=update, max_steps=config.max_steps, logging_steps=config.logging_steps,
                             save_steps=config.save_steps,
                             train_batch_size=config.prompts_per_update * config.num_generations,
                             log_history=history)
        state.save_to_json(str(folder / CHECKPOINT_STATE))

    def commit_checkpoint(self, update: int, keep: int | None) -> Path:
        """The staged `checkpoint-{update}` renamed into place; only the latest `keep` kept (None or
        0: all)."""
        final = self.checkpoint(update)
        if final.exists():
            shutil.rmtree(final)
        os.replace(self.staging(update), final)
        if keep:
            for old in self.checkpoints()[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return final

    # metrics.jsonl

    def metric_rows(self, up_to: int | None = None) -> list[dict[str, Any]]:
        """The metric lines (a partial line from a kill skipped), those up to update `up_to` when given."""
        if not self.metrics.exists():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and (up_to is None or row.get("update", 0) <= up_to):
                rows.append(row)
        return rows

    def append_metrics(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def truncate_metrics(self, update: int) -> None:
        """Drop the metric lines past a resumed update (and a partial last line from a kill)."""
        if self.metrics.exists():
            rows = self.metric_rows(update)
            write_jsonl(self.metrics, rows)


MAY_DIFFER_ON_RESUME = frozenset({
    "max_steps", "save_steps", "save_total_limit", "logging_steps", "disable_tqdm", "report_to", "num_threads",
    "resume_from_checkpoint", "overwrite_output_dir", "build_missing", "greedy_eval_batch_size",
    "bootstrap_resamples", "output_dir", "max_train_seconds", "length_drift_threshold", "stop_on_length_drift",
    "max_generated_tokens",
})
"""Settings a resumed run may change: none of them changes the updates already made, or what an update does."""

TRAINING_ARGUMENT_FIELDS = ("adam_beta1", "adam_beta2", "adam_epsilon", "warmup_steps", "warmup_ratio",
                            "gradient_checkpointing", "report_to", "disable_tqdm", "resume_from_checkpoint")
"""Inherited `TrainingArguments` fields the PPO trainer reads (its own fields are all stored)."""

RUN_MARKERS = (RUN_CONFIG, RunDir.metrics, RunDir.before_rows, RunDir.eval)


def rows_by_id(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a greedy evaluation's JSONL file (a training run's, or an SFT policy's
    eval_rows.jsonl) by problem id; ValueError when the file does not exist."""
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows if r}


def _correctness(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {i: float(r["correct"]) for i, r in rows.items()}


class RunDirError(ValueError):
    """A run folder that this run may not use as asked."""


def resolved_settings(config) -> dict[str, Any]:
    """The settings of a run as JSON values: every field of StepPPOConfig itself plus the inherited
    `TrainingArguments` fields the trainer reads."""
    from rl.ppo_config import OWN_SETTINGS

    names = [*OWN_SETTINGS, *TRAINING_ARGUMENT_FIELDS]
    values = {name: getattr(config, name, None) for name in dict.fromkeys(names)}
    return json.loads(json.dumps(values, default=str))


def stored_settings(out: str | Path) -> dict[str, Any] | None:
    """OUTPUT_DIR/run_config.json, None when the folder has none; RunDirError when it is unreadable."""
    path = Path(out) / RUN_CONFIG
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
    except (ValueError, RecursionError) as err:
        raise RunDirError(f"{path}: not a JSON object ({type(err).__name__}); remove it or pass "
                          "--overwrite_output_dir") from None
    if not isinstance(stored, dict):
        raise RunDirError(f"{path}: not a JSON object; remove it or pass --overwrite_output_dir")
    from rl.setting_names import translate_settings

    return translate_settings(stored)  # a run stored before the settings took TRL's names


SETTINGS_ADDED_LATER = {"step_credit": "return", "entropy_coef": 0.0, "drop_flat_groups": False, "mc_rollouts": 4,
                        "scale_rewards": "group", "answer_match": "strict", "length_drift_updates": 3,
                        "progress_coef": 1.0, "progress_rollouts": 4, "prover": "policy", "prover_best_of": 1,
                        "continuation_sampling": "separate", "continuation_batch_size": 512,
                        "continuation_boundaries": 0, "continuation_round_tokens": 0,
                        "hf_decoding": "generate"}
"""Settings a run stored before they existed, with the value such a run computed with."""


def settings_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: stored -> current` for each setting a resume may not change."""
    stored = {**{k: v for k, v in SETTINGS_ADDED_LATER.items() if k in current}, **stored}
    return [f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in sorted(set(stored) | set(current))
            if k not in MAY_DIFFER_ON_RESUME and stored.get(k) != current.get(k)]


def _is_run_folder(out: Path) -> bool:
    return any((out / m).exists() for m in RUN_MARKERS) or any(out.glob("checkpoint-*"))


def check_writable(out: Path) -> None:
    """RunDirError unless a file can be made in `out`, or, while it does not exist, in the nearest
    folder above it (where it would be made): a probe file, removed at once, so that a run that
    cannot write its results is refused before it loads a model, not after."""
    where = out
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise RunDirError(f"--output_dir {out}: {where} is a file, so the folder cannot be made there; "
                          "choose another folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise RunDirError(f"--output_dir {out}: cannot write in {where} ({err.strerror or err}); "
                          "choose a folder you can write to") from None


def check_run_dir(config, resume: str | None = None) -> str:
    """What starting this run will do to OUTPUT_DIR: 'new' (empty or absent), 'overwrite' (cleared
    first), 'resume' (a stored run with the same settings); RunDirError when it may not be used.
    `resume`: the run's --resume_from_checkpoint (default: the config's)."""
    resume = config.resume_from_checkpoint if resume is None else resume
    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--output_dir {out}: not a directory")
    check_writable(out)
    if not out.exists() or not any(out.iterdir()):
        return "new"
    if resume:
        stored = stored_settings(out)
        if stored is None:
            raise RunDirError(f"--resume_from_checkpoint: {out} has no {RUN_CONFIG}, so its settings are unknown; "
                              "resume it with the toolkit version that started it, or start afresh with "
                              "--overwrite_output_dir")
        changes = settings_changes(stored, resolved_settings(config))
        if changes:
            raise RunDirError(f"--resume_from_checkpoint: {out} was started with other settings ("
                              + "; ".join(changes) + "); pass the same ones (only "
                              + ", ".join(sorted(MAY_DIFFER_ON_RESUME - {"output_dir"}))
                              + " may change), or start afresh with --overwrite_output_dir")
        return "resume"
    if not getattr(config, "overwrite_output_dir", False):
        raise RunDirError(f"--output_dir {out} is not empty (an earlier run?): pass --resume_from_checkpoint auto "
                          "to continue it, --overwrite_output_dir to replace it, or choose another folder")
    if not _is_run_folder(out):
        raise RunDirError(f"--overwrite_output_dir: {out} does not hold a PPO run ({RUN_CONFIG}, {RunDir.metrics} or "
                          "checkpoint-N); it is not cleared: choose another folder")
    return "overwrite"


def prepare_run_dir(config, resume: str | None = None) -> str:
    """`check_run_dir`, then clear OUTPUT_DIR for an overwrite, and store the settings in
    run_config.json (on resume too: the settings that may change are then the latest)."""
    action = check_run_dir(config, resume)
    out = Path(config.output_dir)
    if action == "overwrite":
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_CONFIG).write_text(json.dumps(resolved_settings(config), indent=2) + "\n")
    return action


def with_stored_settings(config):
    """The run's stored settings (run_config.json in OUTPUT_DIR), with the fields of `config` that
    differ from their defaults on top (flags given on the command line); `config` when none is stored."""
    from rl.ppo_config import StepPPOConfig

    stored = stored_settings(config.output_dir)
    if stored is None:
        return config
    given, default = resolved_settings(config), resolved_settings(StepPPOConfig(output_dir=config.output_dir))
    known = set(StepPPOConfig.__dataclass_fields__)
    values = {k: v for k, v in stored.items() if k in known}
    values.update({k: v for k, v in given.items() if v != default.get(k)})
    return StepPPOConfig(**values)
