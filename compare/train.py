"""Building the artefacts: the SFT policy (`rl.sft`), the PSV (StepCo-tree annotation, then
`reward_models.train`) and each PPO run (`rl/ppo_step.py`), in this process or as the command a
job runs; each finished artefact gets its cache marker."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from compare.cache import MARKER, Artefact, verifier_spec, write_marker
from compare.config import ROOT, CompareConfig, CompareError, to_argv
from compare.jobs import log, run_logged


def sft_command(cfg: CompareConfig, art: Artefact) -> list[str]:
    argv = to_argv(cfg.sft.args) + ["--output_dir", str(art.dir)]
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, "-m", "rl.sft", *argv]


def ppo_argv(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    run = cfg.ppo.runs[name]
    art = arts[name]
    threads = []
    if "num_threads" not in cfg.ppo.args and "num_threads" not in run.args:
        # PPO runs side by side share the cores: one torch thread each; a run alone may use them all
        threads = ["--num_threads", "1" if cfg.workers > 1 else "0"]
    return to_argv({**cfg.ppo.args, **run.args}) + [
        "--reward", run.reward, "--policy", arts["sft"].spec, "--verifier", verifier_spec(cfg, arts),
        "--output_dir", str(art.dir), "--build_missing", "false", "--resume_from_checkpoint", "auto", *threads]


def ppo_command(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, str(ROOT / "rl" / "ppo_step.py"), *ppo_argv(cfg, name, arts)]


def build_sft(cfg: CompareConfig, art: Artefact, log_dir: Path) -> None:
    start = time.time()
    if art.dir.exists():
        log(f"sft: {art.dir} is incomplete (no {MARKER}); training it again from the start")
        shutil.rmtree(art.dir)
    art.dir.mkdir(parents=True)
    log(f"sft: training the SFT policy into {art.dir} (tasks {cfg.sft.args.get('tasks')}, "
        f"{cfg.sft.args.get('n_train')} problems)")
    if cfg.launcher:
        run_logged(sft_command(cfg, art), log_dir / "sft.log", "sft")
    else:
        from rl import sft

        code = sft.main(to_argv(cfg.sft.args) + ["--output_dir", str(art.dir)])
        if code:
            raise CompareError(f"rl.sft failed with exit code {code}")
    extra = {}
    try:
        ev = json.loads((art.dir / "eval.json").read_text())
        extra = {"greedy_accuracy": ev.get("greedy_accuracy"), "n_eval": ev.get("n"),
                 "train_seconds": ev.get("train_seconds")}
    except (OSError, json.JSONDecodeError):
        pass
    write_marker(art, time.time() - start, extra)
    log(f"sft: ready in {time.time() - start:.0f}s ({extra})")


def build_psv(cfg: CompareConfig, art: Artefact, policy: str) -> None:
    from reward_models.annotate import AnnotateConfig, annotate
    from reward_models.train import train_verifier

    start = time.time()
    art.dir.mkdir(parents=True, exist_ok=True)
    rows_path = art.dir / "annotation.jsonl"
    settings = {**cfg.psv.annotate, "policy": policy, "out": str(rows_path), "n": cfg.psv.n_problems}
    log(f"psv: annotating {cfg.psv.n_problems} problems of {settings.get('data', 'world')} ({settings.get('method', 'tree')}) "
        f"into {rows_path} (resumes)")
    try:
        summary = annotate(AnnotateConfig(**settings))
    except TypeError as e:
        raise CompareError(f"psv.annotate: {e}") from None
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise CompareError(f"psv: the annotation of {cfg.psv.n_problems} problems gave no paths "
                           f"(see {rows_path}.summary.json); raise psv.n_problems or train the SFT policy longer")
    verifier_dir = art.dir / "verifier"
    if verifier_dir.exists():
        shutil.rmtree(verifier_dir)
    log(f"psv: training the PSV on {len(rows)} annotated paths into {verifier_dir}")
    try:
        train_verifier(rows, init_from=policy, output_dir=str(verifier_dir), **cfg.psv.train)
    except TypeError as e:
        raise CompareError(f"psv.train: {e}") from None
    write_marker(art, time.time() - start, {"paths": len(rows), "annotation": {
        k: summary.get(k) for k in ("problems", "rows", "steps", "mean_label", "seconds") if k in summary}})
    log(f"psv: ready in {time.time() - start:.0f}s")


def build_ppo_inline(cfg: CompareConfig, name: str, arts: dict[str, Artefact], log_dir: Path) -> None:
    """One PPO run from this process: in it, or through `launcher` when one is set."""
    if cfg.launcher:
        run_logged(ppo_command(cfg, name, arts), log_dir / f"ppo_{name}.log", f"ppo_{name}")
        return
    from rl import ppo_step

    log(f"{name}: training PPO (reward {cfg.ppo.runs[name].reward}) into {arts[name].dir}; resumes from its "
        "checkpoints")
    code = ppo_step.main(ppo_argv(cfg, name, arts))
    if code:
        raise CompareError(f"rl/ppo_step.py ({name}) failed with exit code {code}")


def finish_ppo(art: Artefact) -> None:
    """Check the PPO run's policy and write its marker (build time: the run's own train_seconds)."""
    extra: dict[str, Any] = {}
    try:
        ev = json.loads((art.dir / "eval.json").read_text())
        extra = {k: ev.get(k) for k in ("updates", "responses_per_update", "train_seconds", "greedy_accuracy_before",
                                         "greedy_accuracy_after") if k in ev}
    except (OSError, json.JSONDecodeError):
        pass
    if not (Path(art.spec) / "config.json").exists():
        raise CompareError(f"{art.name}: PPO finished but wrote no policy in {art.spec}")
    write_marker(art, float(extra.get("train_seconds") or 0.0), extra)
