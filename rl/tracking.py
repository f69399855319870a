"""Experiment trackers of a PPO run (`report_to`): where they write, the project and the run name.

accelerate's trackers need three things the trainer used to leave out:

- a logging directory for the trackers that write files (tensorboard, aim): without one,
  `Accelerator(log_with="tensorboard")` stops with "Logging with `tensorboard` requires a
  `logging_dir`". It is `logging_dir` when set, else `OUTPUT_DIR/runs`; tensorboard writes under
  `LOGGING_DIR/<project>`;
- the project name: `--project` when set (TrainingArguments' default `huggingface` counts as
  unset), else the `WANDB_PROJECT` environment variable, else `steprl-ppo`;
- the run name (`--run_name`), which wandb, trackio and swanlab take as an init keyword.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_PROJECT = "steprl-ppo"
UNSET_PROJECT = "huggingface"
"""TrainingArguments' default `project`: read as "not given"."""
RUN_NAME_KEYWORD = {"wandb": "name", "trackio": "name", "swanlab": "experiment_name"}
"""The init keyword each tracker takes a run name under."""


def report_to(value) -> list[str]:
    """`report_to` as a list, without `none`."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [r for r in items if r not in ("none", "", None)]


def logging_dir(args) -> str:
    """The trackers' directory: `logging_dir` when set, else `OUTPUT_DIR/runs`."""
    configured = getattr(args, "logging_dir", None)
    return str(configured) if configured else str(Path(args.output_dir or ".") / "runs")


def project_name(args) -> str:
    """`--project` when set, else `WANDB_PROJECT`, else `steprl-ppo`."""
    project = getattr(args, "project", None)
    if project and project != UNSET_PROJECT:
        return project
    return os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


def init_kwargs(args) -> dict[str, dict[str, Any]]:
    """Per-tracker init keywords: the run name for the trackers that take one."""
    name = getattr(args, "run_name", None)
    if not name:
        return {}
    return {tracker: {keyword: name} for tracker, keyword in RUN_NAME_KEYWORD.items()}


def accelerator_kwargs(args) -> dict[str, Any]:
    """`log_with` and `project_config` for `Accelerator(...)`."""
    from accelerate.utils import ProjectConfiguration

    log_with = report_to(args.report_to)
    return {"log_with": log_with or None,
            "project_config": ProjectConfiguration(project_dir=str(args.output_dir or "."),
                                                   logging_dir=logging_dir(args))}


def init_trackers(accelerator, args) -> None:
    """Start the trackers (main process only) with the run's project, run name and plain config values."""
    config = {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | bool)}
    accelerator.init_trackers(project_name(args), config=config, init_kwargs=init_kwargs(args))
