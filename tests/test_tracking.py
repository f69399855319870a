"""`report_to` on the PPO trainer: the Accelerator gets a logging directory, the tracker gets the
project (`--project`, `WANDB_PROJECT`) and the run name."""

import importlib.util

import pytest

from rl import tracking
from rl.ppo_config import StepPPOConfig


def test_project_run_name_and_logging_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), report_to="none")
    assert tracking.project_name(args) == "steprl-ppo"
    assert tracking.logging_dir(args) == str(tmp_path / "run" / "runs")
    assert tracking.init_kwargs(args) == {}
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert tracking.project_name(args) == "from-env"
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), report_to="none", project="from-config",
                         run_name="seed1", logging_dir=str(tmp_path / "logs"))
    assert tracking.project_name(args) == "from-config"
    assert tracking.logging_dir(args) == str(tmp_path / "logs")
    assert tracking.init_kwargs(args)["wandb"] == {"name": "seed1"}
    assert tracking.init_kwargs(args)["trackio"] == {"name": "seed1"}


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard not installed (pip install 'steprl[tracking]')")
def test_ppo_trainer_logs_to_tensorboard(tmp_path, monkeypatch):
    """`--report_to tensorboard` used to stop at start: "Logging with `tensorboard` requires a `logging_dir`"."""
    from tiny_world_policy import make_ppo_trainer

    monkeypatch.setenv("WANDB_PROJECT", "tb-project")
    trainer, args = make_ppo_trainer(tmp_path, report_to="tensorboard", run_name="seed0")
    tracking.init_trackers(trainer.accelerator, args)
    trainer.accelerator.log({"reward/mean_total": 0.5}, step=1)
    trainer.accelerator.end_training()
    events = list((tmp_path / "run" / "runs" / "tb-project").glob("events.out.tfevents.*"))
    assert events, sorted(p.relative_to(tmp_path) for p in (tmp_path / "run").rglob("*"))
