"""A verifier made of several: each step's score combines the scores of every part.

Two kinds of evidence that fail in different places can be joined: the training-free
`step-confidence` verifier flags low-probability decisions (a name or operand the policy was unsure
of) but cannot see errors the policy makes with confidence; a PSV trained on StepCo-tree labels sees
some of those (they change the final answer) but misses decisions that do not. Rules:

- `product`: the product of the parts' probabilities (independent evidence that the path is on
  track); a step is flagged when the parts together are unsure;
- `min`: the lowest part; a step is flagged when any part is unsure.

Every part scores every path (each in its own one-pass-per-path way), so the tokens read are the
sum of the parts' `tokens_used`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reward_models.verifier import Verifier, validate_paths

RULES = ("product", "min")


class CombinedVerifier:
    def __init__(self, parts: Sequence[Verifier], rule: str = "product"):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
        if len(parts) < 2:
            raise ValueError(f"a combined verifier needs at least two parts, got {len(parts)}")
        self.parts = list(parts)
        self.rule = rule

    @property
    def tokens_used(self) -> int:
        return sum(p.tokens_used for p in self.parts)

    def score(self, questions: Sequence[str], paths: Sequence[Sequence[str]]) -> list[list[float]]:
        validate_paths(questions, paths)
        per_part = [p.score(questions, paths) for p in self.parts]
        combine = math.prod if self.rule == "product" else min
        out = []
        for i, steps in enumerate(paths):
            rows = [part[i] for part in per_part]
            if any(len(r) != len(steps) for r in rows):
                raise ValueError(f"row {i}: a part returned {[len(r) for r in rows]} scores for {len(steps)} steps")
            out.append([float(combine(col)) for col in zip(*rows)])
        return out

    def close(self) -> None:
        for p in self.parts:
            close = getattr(p, "close", None)
            if callable(close):
                close()
