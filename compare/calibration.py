"""StepCo's threshold θ calibrated for earliest-error F1 on the SFT policy's greedy paths of
world *dev* problems (never the test problems), labelled by the world's checker; one θ for every
policy. Cached in DIR/stepco_threshold.json under what it depends on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from compare.cache import Artefact, methods_verifier_spec
from compare.config import CompareConfig
from compare.jobs import log


def calibrate_stepco_threshold(cfg: CompareConfig, arts: dict[str, Artefact], out: Path) -> dict[str, Any] | None:
    """θ for StepCo from world dev paths (see EvalSection.threshold_dev_problems); cached in
    DIR/stepco_threshold.json under what it depends on. None when not asked for or no StepCo."""
    ev = cfg.eval
    if ev.threshold_dev_problems is None or "stepco" not in ev.methods:
        return None
    from backends.base import SamplingParams
    from inference.evaluate import build_generator
    from reasoning.world import generate, world_config_of
    from reward_models.load import load_verifier
    from reward_models.verifier_metrics import (
        calibrate_threshold,
        earliest_error_predictions,
        processbench_metrics,
        sample_world_paths,
        score_items,
        step_metric_inputs,
    )

    spec = methods_verifier_spec(cfg, arts)
    max_new = int(ev.methods["stepco"].get("max_new_tokens", 192))
    key = {"verifier": methods_verifier_spec(cfg, arts, ref=True),
           "policy": arts["sft"].ref, "dev_problems": ev.threshold_dev_problems, "world_seed": ev.world_seed,
           "max_new_tokens": max_new}
    path = out / "stepco_threshold.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            log(f"stepco threshold: reusing {cached['threshold']:.4f} from {path}")
            return cached
    except (OSError, json.JSONDecodeError, KeyError):
        pass
    start = time.time()
    sft = arts["sft"].spec
    rows = generate("dev", ev.threshold_dev_problems, ev.world_seed, world_config_of(sft))
    generator = build_generator(ev.backend, sft, batch_size=ev.batch_size, device=ev.device, **ev.backend_options)
    items = sample_world_paths(generator, rows, 1, SamplingParams(max_new_tokens=max_new, temperature=0.0))
    verifier = load_verifier(spec, sft, batch_size=ev.verifier_batch_size, device=ev.device)
    scores, reasons = score_items(verifier, items, ev.verifier_batch_size)
    s, g, _ = step_metric_inputs(items, scores)
    configured = float(ev.methods["stepco"].get("threshold", 0.5))
    fallback = None
    try:
        threshold = calibrate_threshold(s, g)
    except ValueError as e:  # e.g. no correct dev path: F1 is undefined, keep the configured θ
        threshold, fallback = configured, str(e)
    metrics = processbench_metrics(earliest_error_predictions(s, threshold), g) if s else {
        "f1": 0.0, "acc_erroneous": 0.0, "acc_correct": 0.0}
    info = {"key": key, "threshold": threshold, "dev_paths": len(s),
            "dev_unscorable": sum(r is not None for r in reasons), "dev_f1": metrics["f1"],
            "dev_acc_erroneous": metrics["acc_erroneous"], "dev_acc_correct": metrics["acc_correct"],
            "configured_threshold": configured, "fallback": fallback, "seconds": round(time.time() - start, 1)}
    path.write_text(json.dumps(info, indent=2) + "\n")
    if fallback:
        log(f"warning: stepco threshold not calibrated ({fallback}); using the configured {configured}")
    else:
        log(f"stepco threshold: {threshold:.4f} (dev F1 {metrics['f1']:.3f} on {len(s)} greedy dev paths) in "
            f"{info['seconds']:.0f}s")
    return info
