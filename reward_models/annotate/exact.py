"""`exact` (world problems only, a reference): sampled paths labelled by the world's step checker
(`exact_labels`: 1.0 before the earliest error, 0.0 from it on)."""

from __future__ import annotations

from reward_models.annotate.base import exact_labels
from reward_models.annotate.sampling import labelled_samples

annotate_group = labelled_samples("exact", lambda problem, p: exact_labels(problem, p.steps))
