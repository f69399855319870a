"""One way to name a verifier on a command line: `load_verifier(spec, policy)`.

A spec is one of

- a PSV directory: a full PSV (`psv_config.json`, or a `*ForTokenClassification` config) or a LoRA
  adapter (`adapter_config.json`), as `reward_models.train` saves them;
- `confidence`: the training-free confidence of the policy given as `policy`;
- `exact`: the world's exact step checker (world problems only; it is built from their rows);
- `math-shepherd:PATH`: a Math-Shepherd-style causal-LM PRM (P(+) vs P(-) at a step tag);
- `token-prm:PATH`: a two-label token-classification PRM read at a separator after each step.

Evaluation, Best-of-N and StepCo all load their verifier here, so a spec means the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from reward_models.verifier import Verifier

BUILTIN = ("confidence", "exact")


def psv_dir_kind(path: str | Path) -> str | None:
    """'lora' or 'full' when `path` is a PSV directory; 'policy' for a causal LM; None otherwise."""
    p = Path(path)
    if not p.is_dir():
        return None
    if (p / "adapter_config.json").exists():
        return "lora"
    if (p / "psv_config.json").exists():
        return "full"
    config = p / "config.json"
    if not config.exists():
        return None
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (json.JSONDecodeError, AttributeError):
        return None
    if any(a.endswith("ForTokenClassification") for a in archs):
        return "full"
    if any(a.endswith("ForCausalLM") for a in archs):
        return "policy"
    return None


def load_verifier(
    spec: str,
    policy: str | None = None,
    *,
    world_rows: Sequence[dict] | None = None,
    batch_size: int = 32,
    device: str | None = None,
) -> Verifier:
    """The verifier named by `spec` (see the module docstring).

    `policy` is needed for `confidence`; `world_rows` (rows with a `world` field) for `exact`.
    Raises ValueError with what to pass instead when the spec names nothing usable.
    """
    if spec == "confidence":
        if not policy:
            raise ValueError("the confidence verifier reads the policy's probabilities: pass --policy")
        from reward_models.confidence import ConfidenceVerifier

        return ConfidenceVerifier.from_pretrained(policy, batch_size=batch_size, device=device)
    if spec == "exact":
        rows = [r for r in (world_rows or []) if isinstance(r, dict) and "world" in r]
        if not rows:
            raise ValueError("the exact verifier checks world problems only: evaluate on world data")
        from reward_models.exact import ExactVerifier

        return ExactVerifier.from_rows(rows)
    if spec.startswith("math-shepherd:"):
        from reward_models.adapters import MathShepherdVerifier

        return MathShepherdVerifier.from_pretrained(spec.split(":", 1)[1], batch_size=batch_size)
    if spec.startswith("token-prm:"):
        from reward_models.adapters import TokenClassificationPRMVerifier

        return TokenClassificationPRMVerifier.from_pretrained(spec.split(":", 1)[1], batch_size=batch_size)
    kind = psv_dir_kind(spec)
    if kind in ("lora", "full"):
        from reward_models.psv import PSVVerifier

        return PSVVerifier.from_pretrained(spec, batch_size=batch_size, device=device)
    if kind == "policy":
        raise ValueError(
            f"{spec} is a causal LM (a policy), not a PSV: train one with `python -m reward_models.train "
            f"--init_from {spec}`, or use `confidence` with --policy {spec}"
        )
    where = "no such directory" if not Path(spec).exists() else "not a PSV directory"
    raise ValueError(
        f"verifier {spec!r}: {where}; expected a PSV directory (psv_config.json, adapter_config.json or a "
        f"token-classification config.json) or one of {', '.join(BUILTIN)}"
    )
