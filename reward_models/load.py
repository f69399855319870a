"""One way to name a verifier on a command line: `load_verifier(spec, policy)`.

A spec is one of

- a PSV directory: a full PSV (`psv_config.json`, or a `*ForTokenClassification` config) or a LoRA
  adapter (`adapter_config.json`), as `reward_models.train` saves them;
- `confidence` or `confidence:PATH`: the training-free confidence of a policy (PATH, else the
  policy given as `policy`) in each step's result;
- `step-confidence` or `step-confidence:PATH`: the same on every token of each step (names,
  operands, result: the decisions a step makes);
- `step-likelihood` or `step-likelihood:PATH`: the geometric mean of those token probabilities
  instead of their minimum (a step's per-token likelihood: one near-uniform token, such as a name
  the model picks at random, does not decide every score);
- `exact`: the world's exact step checker (world problems only; it is built from their rows);
- `exact-noisy:accept=A/kinds=K+K/reject=R/seed=S`: that checker with systematic errors, the same
  verdict every time a step text appears (`reward_models.exact_noisy`): a PRM quality axis;
- a published PRM family, scored as its model card does (`reward_models.prm_families`, one module
  each): `qwen-prm:PATH` (Qwen2.5-Math-PRM), `rlhflow-prm:PATH` (RLHFlow's Llama-3.1 PRMs),
  `skywork-prm:PATH` (Skywork-o1-Open-PRM), `math-shepherd:PATH` (P(+) vs P(-) at a step tag),
  `token-prm:PATH` (a two-label token-classification PRM read at a separator after each step);
- `auto:PATH`: the family (or PSV, implicit PRM) recognised from the checkpoint's config.json and
  tokenizer files, said on stderr; a plain PATH whose architecture is a published PRM's own
  (`Qwen2ForProcessRewardModel`, `Qwen2ForPrmModel`) is read the same way;
- `implicit:PATH`: PRIME's implicit PRM (`reward_models.implicit_prm`): an LM trained on the
  answer check's outcome labels of the policy's own samples, read against its frozen reference;
  a step's score is sigmoid of the cumulative implicit reward (beta * log-likelihood ratio) so far;
- `product:SPEC,SPEC[,...]` or `min:SPEC,SPEC[,...]`: several of the above combined step by step
  (`reward_models.combined`), e.g. `product:step-confidence:outputs/sft_tiny,outputs/psv_tiny`.

Name the policy in a confidence spec (`confidence:PATH`) wherever several policies are compared
with one verifier: a bare `confidence` reads whichever policy is being evaluated, so each policy
would be judged by itself.

Evaluation, Best-of-N and StepCo all load their verifier here, so a spec means the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from inference.backends.model_files import check_model_folder, check_model_path
from reward_models.prm_families import FAMILY_NAMES
from reward_models.verifier import Verifier

BUILTIN = ("confidence", "step-confidence", "step-likelihood", "exact")
CONFIDENCE_SPANS = {"confidence": "result", "step-confidence": "step", "step-likelihood": "step"}
CONFIDENCE_REDUCE = {"step-likelihood": "mean"}
"""How a confidence verifier reduces a span's token probabilities: `min` unless named here."""
COMBINE_RULES = ("product", "min")


def split_spec(spec: str) -> tuple[str, str | None]:
    """("confidence", "PATH") for "confidence:PATH"; (spec, None) when it has no known prefix."""
    head, sep, rest = spec.partition(":")
    if sep and head in (*CONFIDENCE_SPANS, *COMBINE_RULES, *FAMILY_NAMES, "auto", "implicit", "exact-noisy"):
        return head, rest
    return spec, None


def spec_parts(spec: str) -> list[str]:
    """The parts of a combined spec (`product:A,B`); [spec] for any other."""
    head, rest = split_spec(spec)
    if head not in COMBINE_RULES:
        return [spec]
    parts = [p.strip() for p in (rest or "").split(",")]
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"verifier {spec!r}: {head}: needs two or more comma-separated specs")
    for p in parts:
        if split_spec(p)[0] in COMBINE_RULES:
            raise ValueError(f"verifier {spec!r}: combined specs do not nest")
    return parts


def map_spec_parts(spec: str, fn) -> str:
    """`spec` with `fn` applied to each of its parts (a combined spec keeps its rule)."""
    head = split_spec(spec)[0]
    if head in COMBINE_RULES:
        return f"{head}:" + ",".join(fn(p) for p in spec_parts(spec))
    return fn(spec)


def pin_policy(spec: str, policy: str) -> str:
    """`spec` with every bare confidence part bound to `policy` (a fixed verifier across policies)."""

    def pin(part: str) -> str:
        head, rest = split_spec(part)
        return f"{head}:{policy}" if head in CONFIDENCE_SPANS and not rest else part

    return map_spec_parts(spec, pin)


def needs_policy(spec: str) -> bool:
    """Whether `spec` reads the probabilities of the policy passed alongside it."""
    return any(split_spec(p)[0] in CONFIDENCE_SPANS and not split_spec(p)[1] for p in spec_parts(spec))


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

    `policy` is needed for a bare `confidence` / `step-confidence`; `world_rows` (rows with a
    `world` field) for `exact`.
    Raises ValueError with what to pass instead when the spec names nothing usable.
    """
    head, rest = split_spec(spec)
    if head in COMBINE_RULES:
        from reward_models.combined import CombinedVerifier

        parts = [load_verifier(p, policy, world_rows=world_rows, batch_size=batch_size, device=device)
                 for p in spec_parts(spec)]
        return CombinedVerifier(parts, rule=head)
    if head in CONFIDENCE_SPANS:
        path = _confidence_policy(head, rest, policy)
        from reward_models.confidence import ConfidenceVerifier

        return ConfidenceVerifier.from_pretrained(path, batch_size=batch_size, device=device,
                                                  span=CONFIDENCE_SPANS[head],
                                                  reduce=CONFIDENCE_REDUCE.get(head, "min"))
    if head == "implicit":
        from reward_models.implicit_prm import ImplicitPRM

        return ImplicitPRM.from_pretrained(rest or "", batch_size=batch_size, device=device)
    if head == "exact-noisy":
        from reward_models.exact_noisy import load

        return load(rest, world_rows)
    if spec == "exact":
        rows = [r for r in (world_rows or []) if isinstance(r, dict) and "world" in r]
        if not rows:
            raise ValueError("the exact verifier checks world problems only: evaluate on world data")
        from reward_models.exact import ExactVerifier

        return ExactVerifier.from_rows(rows)
    if head == "auto":
        return load_verifier(recognise_spec(rest or ""), policy, world_rows=world_rows, batch_size=batch_size,
                             device=device)
    if head in FAMILY_NAMES:
        from reward_models.prm_families import get_family

        verifier = get_family(head).verifier(rest or "", batch_size=batch_size)
        if device is not None:  # e.g. the PPO process's GPU: a 7B PRM must not score on the CPU
            verifier.model.to(device)
        return verifier
    if _published_prm_spec(spec) is not None:
        return load_verifier(f"auto:{spec}", policy, world_rows=world_rows, batch_size=batch_size, device=device)
    _check_psv_dir(spec)
    from reward_models.psv import PSVVerifier

    return PSVVerifier.from_pretrained(spec, batch_size=batch_size, device=device)


def check_spec(spec: str, policy: str | None = None) -> None:
    """The checks of `load_verifier` that need no weights, so that a run can refuse a misspelt spec
    before it loads anything: ValueError with what to pass instead."""
    head, rest = split_spec(spec)
    if head in COMBINE_RULES:
        for part in spec_parts(spec):
            check_spec(part, policy)
    elif head in CONFIDENCE_SPANS:
        _confidence_policy(head, rest, policy)
    elif head == "exact-noisy":
        from reward_models.exact_noisy import parse_noise_spec

        parse_noise_spec(rest)
    elif head == "implicit":
        from reward_models.implicit_prm import check_implicit_dir

        check_implicit_dir(rest or "")
    elif head in (*FAMILY_NAMES, "auto"):
        if not rest:
            raise ValueError(f"verifier {spec!r}: name the model ({head}:PATH)")
        check_model_path(f"verifier {head}:", rest)
        if head == "auto":
            recognise_spec(rest, say=False)
    elif spec != "exact" and _published_prm_spec(spec) is not None:
        recognise_spec(spec, say=False)  # the folder's files checked, as for auto:PATH
    elif spec != "exact":
        _check_psv_dir(spec)


def _published_prm_spec(path: str) -> str | None:
    """The family spec of a plain PATH that holds a published PRM of its own architecture (one a PSV
    or a policy folder never has: `Qwen2ForProcessRewardModel`, `Qwen2ForPrmModel`), else None; a
    causal LM or token-classification folder stays what it was (a policy, a PSV): name its family."""
    if psv_dir_kind(path) is not None or not (Path(path) / "config.json").is_file():
        return None
    from reward_models.prm_families import get_family
    from reward_models.prm_families.base import Checkpoint, PRMCheckpointError

    try:
        ckpt = Checkpoint.read(path)
    except PRMCheckpointError:
        return None
    found = [name for name in FAMILY_NAMES if get_family(name).recognise(ckpt)]
    return f"{found[0]}:{path}" if len(found) == 1 else None  # auto:PATH then checks the folder and says it


def recognise_spec(path: str, *, say: bool = True) -> str:
    """The spec `auto:PATH` stands for: a PSV or implicit PRM folder as such, else the one PRM family
    whose recogniser accepts the checkpoint's config.json and tokenizer files; said on stderr
    (`say`). ValueError naming the families when none or several match."""
    import sys

    from reward_models.prm_families import get_family
    from reward_models.prm_families.base import Checkpoint

    check_model_path("verifier auto:", path)
    if not Path(path).is_dir():
        raise ValueError(f"verifier auto:{path}: auto reads a local checkpoint folder; name the family "
                         f"({', '.join(f'{n}:PATH' for n in FAMILY_NAMES)})")
    if (Path(path) / "implicit_prm.json").exists():
        name, spec, why = "implicit", f"implicit:{path}", "implicit_prm.json"
    elif (Path(path) / "psv_config.json").exists() or (Path(path) / "adapter_config.json").exists():
        name, spec, why = "PSV", path, "psv_config.json or adapter_config.json"
    else:
        ckpt = Checkpoint.read(path)
        found = [(name, reason) for name in FAMILY_NAMES if (reason := get_family(name).recognise(ckpt))]
        if len(found) != 1:
            which = "no PRM family" if not found else "several families (" + ", ".join(n for n, _ in found) + ")"
            raise ValueError(f"verifier auto:{path}: {which} recognised from config.json (architectures "
                             f"{list(ckpt.architectures)}); name one: {', '.join(f'{n}:PATH' for n in FAMILY_NAMES)}")
        (name, why), = found
        spec = f"{name}:{path}"
    if say:
        print(f"verifier auto:{path}: read as {name} ({why})", file=sys.stderr)
    return spec


def _confidence_policy(head: str, rest: str | None, policy: str | None) -> str:
    """The policy a confidence verifier reads: the one named in the spec, else `policy`."""
    path = rest or policy
    if not path:
        raise ValueError(f"the {head} verifier reads a policy's probabilities: pass --policy or "
                         f"name it ({head}:PATH)")
    if Path(path).is_dir() and psv_dir_kind(path) != "policy":
        raise ValueError(f"{head}: {path} is not a causal-LM policy directory")
    if rest:  # a path the spec names: a typo is said here, not as a Hub error after loading
        check_model_path(f"verifier {head}:", path)
    elif Path(path).is_dir():
        check_model_folder(f"verifier {head} (the policy)", path)
    return path


def _check_psv_dir(spec: str) -> None:
    kind = psv_dir_kind(spec)
    if kind in ("lora", "full"):
        check_model_folder("verifier", spec)
        return
    if kind == "policy" and (Path(spec) / "implicit_prm.json").exists():
        raise ValueError(f"{spec} is an implicit PRM: name it implicit:{spec}")
    if kind == "policy":
        raise ValueError(
            f"{spec} is a causal LM (a policy), not a PSV: train one with `python -m reward_models.train "
            f"--init_from {spec}`, or use `step-confidence:{spec}` (its own probabilities, no training); a "
            f"published causal-LM PRM is named by its family: `rlhflow-prm:{spec}`, `math-shepherd:{spec}` or `auto:{spec}`"
        )
    where = "no such directory" if not Path(spec).exists() else "not a PSV directory"
    raise ValueError(
        f"verifier {spec!r}: {where}; expected a PSV directory (psv_config.json, adapter_config.json or a "
        f"token-classification config.json), one of {', '.join(BUILTIN)}, or a combination "
        f"({' or '.join(r + ':A,B' for r in COMBINE_RULES)})"
    )
