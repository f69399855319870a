"""Best-of-N over the samples a finished self-consistency run drew (no new generation).

`inference.methods.best_of_n.run` itself, with the tracker's `generate` answering from the
self-consistency run's trace (its sample texts, finish reasons and token counts, charged to each
problem as the generator would have charged them), so that Best-of-N and the vote are compared sample
for sample. A lab tool, not a method of the toolkit:

    python -m inference.evaluate --method experiments.bon_replay --samples_from RUN/results.jsonl --n 4 ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from backends.base import Completion
from inference.methods import best_of_n


@dataclass
class Config(best_of_n.Config):
    samples_from: str = ""
    """results.jsonl of a self_consistency run on the same problems (at least `n` samples each)."""


def _load(path: str) -> dict[str, dict]:
    rows = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows[r["question"]] = r
    return rows


def run(problems, tracker, config: Config):
    stored = _load(config.samples_from)

    def replay(owners, prompts, params):
        out = []
        for owner in owners:
            t = stored[problems[owner].question]["trace"]
            comps = [Completion(text, pt, ct, fr) for text, pt, ct, fr in
                     zip(t["samples"], t["prompt_tokens"], t["completion_tokens"], t["finish_reasons"])]
            if len(comps) < params.n:
                raise ValueError(f"{len(comps)} stored samples, n={params.n}")
            comps = comps[: params.n]
            u = tracker.usage[owner]
            u.llm_calls += len(comps)
            for c in comps:
                u.prompt_tokens += c.prompt_tokens
                u.completion_tokens += c.completion_tokens
            out.append(comps)
        return out

    tracker.generate = replay
    base = best_of_n.Config(**{k: getattr(config, k) for k in best_of_n.Config.__dataclass_fields__})
    return best_of_n.run(problems, tracker, base)
