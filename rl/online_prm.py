"""PRIME's online update of the implicit PRMs a PPO run rewards with (`--verifier_online_update`):
after each update's rewards, each PRM takes optimiser steps on that update's rollouts, labelled by
the answer check alone."""

from __future__ import annotations

import time
from collections.abc import Callable

from reasoning.steps import answer_correct, split_steps
from rl.batches import Rollouts


def online_update(prms: list, batch: Rollouts, args, accelerator,
                  all_ranks: Callable[[bool], bool]) -> dict[str, float]:
    """`--verifier_online_steps` optimiser steps of each implicit PRM on this update's rollouts with
    steps, labelled by the answer check (--answer_match); gradients averaged over processes. Every
    rank steps or none (`all_ranks`: the gradient mean is collective). Returns the metrics."""
    t = time.time()
    idx = [i for i, text in enumerate(batch.texts)
           if (steps := split_steps(text).steps) and all(s.strip() for s in steps)]
    if not all_ranks(bool(idx)):
        return {"verifier/online_paths": 0.0, "time/verifier_update": time.time() - t}
    questions = [batch.problems[i].question for i in idx]
    paths = [split_steps(batch.texts[i]).steps for i in idx]
    labels = [float(answer_correct(batch.texts[i], batch.problems[i], args.answer_match)) for i in idx]
    sync = None
    if accelerator.num_processes > 1:
        def sync(grad):
            return accelerator.reduce(grad, reduction="mean")
    out: dict[str, float] = {}
    for k, prm in enumerate(prms):
        got = prm.online_update(questions, paths, labels, steps=args.verifier_online_steps,
                                learning_rate=args.verifier_online_learning_rate, grad_sync=sync)
        out["verifier/online_loss" + (f"_{k}" if k else "")] = got["loss"]
    out.update({"verifier/online_paths": float(len(idx)), "time/verifier_update": time.time() - t})
    return out
