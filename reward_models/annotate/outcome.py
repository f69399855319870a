"""`outcome`: sampled paths, every step labelled with the path's answer check (1.0 right, 0.0 wrong),
no rollout: the samples an outcome verifier or PRIME's implicit PRM learns from."""

from __future__ import annotations

from reward_models.annotate.sampling import labelled_samples

annotate_group = labelled_samples("outcome", lambda problem, p: [float(p.correct)] * len(p.steps))
