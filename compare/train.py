"""Building the artefacts: the SFT policy and the verifier LM (`rl.sft`), the PSV (StepCo-tree annotation, then
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

from compare.cache import MARKER, Artefact, ppo_verifier_spec, write_marker
from compare.config import ROOT, VERIFIER_LM, CompareConfig, CompareError, to_argv
from compare.jobs import log, run_logged
from rl.run_dir import RunDir


def sft_args(cfg: CompareConfig, art: Artefact) -> dict[str, Any]:
    """The rl.sft flags of an SFT artefact: the policy's or the verifier LM's."""
    return cfg.verifier_lm.args if art.name == VERIFIER_LM else cfg.sft.args


def sft_command(cfg: CompareConfig, art: Artefact) -> list[str]:
    argv = to_argv(sft_args(cfg, art)) + ["--output_dir", str(art.dir)]
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, "-m", "rl.sft", *argv]


def ppo_argv(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    run = cfg.ppo.runs[name]
    art = arts[name]
    threads = []
    if "num_threads" not in cfg.ppo.args and "num_threads" not in run.args:
        # PPO runs side by side share the cores: one torch thread each; a run alone may use them all
        threads = ["--num_threads", "1" if cfg.workers > 1 else "0"]
    spec = ppo_verifier_spec(cfg, name, arts)
    verifier = ["--verifier", spec] if spec is not None else []
    return to_argv({**cfg.ppo.args, **run.args}) + [
        "--reward", run.reward, "--model_name_or_path", arts["sft"].spec, *verifier,
        "--output_dir", str(art.dir), "--build_missing", "false", "--resume_from_checkpoint", "auto", *threads]


def ppo_command(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, str(ROOT / "rl" / "ppo_step.py"), *ppo_argv(cfg, name, arts)]


def ppo_progress(metrics: Path, total: int | None) -> str | None:
    """One line on a PPO run under way, from its metrics file: the update reached, the rollouts'
    accuracy and reward at the last logged update, and the probe's latest greedy accuracy; None
    before the first update is logged (the run is still loading or evaluating before training)."""
    from reasoning.benchmarks import read_appended_jsonl

    rows = [row for _, row in read_appended_jsonl(metrics)[0] if "update" in row]  # a line being written is left out
    if not rows:
        return None
    last = rows[-1]
    done = f"update {last['update']}" + (f"/{total}" if total else "")
    parts = [done]
    if "rollout/accuracy" in last:
        parts.append(f"rollout accuracy {last['rollout/accuracy']:.2f}")
    if "reward/mean_total" in last:
        parts.append(f"reward {last['reward/mean_total']:.3f}")
    probes = [r for r in rows if "probe/greedy_accuracy" in r]
    if probes:
        parts.append(f"probe greedy {probes[-1]['probe/greedy_accuracy']:.2f} "
                     f"(update {probes[-1]['update']}; {probes[0]['probe/greedy_accuracy']:.2f} at the start)")
    if "elapsed" in last:
        parts.append(f"{last['elapsed']:.0f} s of training")
    return ", ".join(parts)


def ppo_updates(cfg: CompareConfig, name: str) -> int | None:
    """The PPO run's number of updates as its flags set it (None: rl/ppo_step.py's default)."""
    value = {**cfg.ppo.args, **cfg.ppo.runs[name].args}.get("max_steps")
    return int(value) if value is not None else None


def build_sft(cfg: CompareConfig, art: Artefact, log_dir: Path) -> None:
    """Train an SFT artefact (the policy or the verifier LM) in this process, or through `launcher`."""
    start = time.time()
    if art.dir.exists():
        log(f"{art.name}: {art.dir} is incomplete (no {MARKER}); training it again from the start")
        shutil.rmtree(art.dir)
    art.dir.mkdir(parents=True)
    args = sft_args(cfg, art)
    log(f"{art.name}: training into {art.dir} (tasks {args.get('tasks')}, teacher noise "
        f"{args.get('teacher_noise', 'rl.sft default')}, {args.get('n_train')} problems)")
    if cfg.launcher:
        run_logged(sft_command(cfg, art), log_dir / f"{art.name}.log", art.name)
    else:
        from rl import sft

        code = sft.main(to_argv(args) + ["--output_dir", str(art.dir)])
        if code:
            raise CompareError(f"rl.sft ({art.name}) failed with exit code {code}")
    extra = {}
    try:
        ev = json.loads(RunDir(art.dir).eval.read_text())
        extra = {"greedy_accuracy": ev.get("greedy_accuracy"), "n_eval": ev.get("n"),
                 "train_seconds": ev.get("train_seconds")}
    except (OSError, json.JSONDecodeError):
        pass
    if not (art.dir / "config.json").exists():
        raise CompareError(f"{art.name}: rl.sft finished but wrote no model in {art.dir}")
    write_marker(art, time.time() - start, extra)
    log(f"{art.name}: ready in {time.time() - start:.0f}s ({extra})")


def build_psv(cfg: CompareConfig, art: Artefact, policy: str) -> None:
    from reward_models.annotate import AnnotateConfig, NoAnnotatedPaths, train_on_annotation

    start = time.time()
    art.dir.mkdir(parents=True, exist_ok=True)
    rows_path = art.dir / "annotation.jsonl"
    settings = {**cfg.psv.annotate, "policy": policy, "out": str(rows_path), "n": cfg.psv.n_problems}
    log(f"psv: annotating {cfg.psv.n_problems} problems of {settings.get('data', 'world')} "
        f"({settings.get('method', 'tree')}) "
        f"into {rows_path} (resumes)")
    try:
        annotate_config = AnnotateConfig(**settings)
    except TypeError as e:
        raise CompareError(f"psv.annotate: {e}") from None
    verifier_dir = art.dir / "verifier"
    if verifier_dir.exists():
        shutil.rmtree(verifier_dir)
    try:
        rows, summary = train_on_annotation(annotate_config, str(verifier_dir), log=lambda m: log(f"psv: {m}"),
                                            **cfg.psv.train)
    except TypeError as e:
        raise CompareError(f"psv.train: {e}") from None
    except NoAnnotatedPaths as e:
        raise CompareError(f"psv: {e}; raise psv.n_problems or train the SFT policy longer") from None
    write_marker(art, time.time() - start, {"paths": len(rows), "annotation": {
        k: summary.get(k) for k in ("problems", "rows", "steps", "mean_label", "seconds", "prompt_too_long")
        if k in summary}})
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
        ev = json.loads(RunDir(art.dir).eval.read_text())
        extra = {k: ev.get(k) for k in ("updates", "responses_per_update", "train_seconds", "greedy_accuracy_before",
                                         "greedy_accuracy_after", "prompt_too_long") if k in ev}
    except (OSError, json.JSONDecodeError):
        pass
    if not (Path(art.spec) / "config.json").exists():
        raise CompareError(f"{art.name}: PPO finished but wrote no policy in {art.spec}")
    write_marker(art, float(extra.get("train_seconds") or 0.0), extra)
