"""A PSV trained on the policy's own annotated paths: the annotation, then `reward_models.train`."""

from __future__ import annotations

import json
from pathlib import Path

from reward_models.annotate.run import annotate


class NoAnnotatedPaths(ValueError):
    """An annotation that gave no stepwise row to train on."""


def train_on_annotation(annotate_config, output_dir: str, log=None, **train_args) -> tuple[list[dict], dict]:
    """A PSV from the policy's own paths: annotate them (`reward_models.annotate`, appending to
    `annotate_config.out`, so an interrupted annotation resumes), read the stepwise rows back, and
    train on them from `annotate_config.policy` into `output_dir` (`train_verifier`'s keywords).
    `log(message)` hears when training starts. Returns the rows and the annotation's summary;
    NoAnnotatedPaths when the annotation gave no path."""
    from reward_models.train import train_verifier

    summary = annotate(annotate_config)
    rows_path = Path(annotate_config.out)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise NoAnnotatedPaths(f"the annotation of {annotate_config.n} problems gave no paths (see "
                               f"{rows_path}.summary.json)")
    if log is not None:
        log(f"training the PSV on {len(rows)} annotated paths into {output_dir}")
    train_verifier(rows, init_from=annotate_config.policy, output_dir=output_dir, **train_args)
    return rows, summary
