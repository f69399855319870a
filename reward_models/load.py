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

Every kind is registered here once (`register_verifier_kind`, beside its loader): its name, how a
spec of it is written, how it loads, and the checks that need no weights. `load_verifier` loads,
`check_spec` checks a spec before anything loads (every CLI), `check_spec_form` checks only its
form, touching no file a later stage may build (the comparison's config check), and an unknown
kind's error lists every registered kind (`verifier_kinds`). Evaluation, Best-of-N, StepCo, PPO and
the comparison all read their verifier here, so a spec means the same everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.model_files import check_model_folder, check_model_path
from reward_models.prm_families import FAMILY_NAMES
from reward_models.verifier import Verifier

# ---------------------------------------------------------------------------------------------
# The registry: one entry per kind, with its loader and its checks.


@dataclass(frozen=True)
class LoadContext:
    """What a loader may need besides the spec."""

    policy: str | None = None
    """The policy a bare confidence spec reads."""
    world_rows: Sequence[dict] | None = None
    """World rows (with a `world` field), for the exact checkers."""
    batch_size: int = 32
    device: str | None = None


@dataclass(frozen=True)
class VerifierKind:
    """One kind of verifier spec."""

    name: str
    """The spec prefix (`step-confidence`); `PATH` for a folder named by its path alone."""
    usage: str
    """How a spec of this kind is written, as errors list it."""
    load: Callable[[str | None, LoadContext], Verifier]
    """The verifier of `NAME:REST` (REST None for a bare spec, the path for PATH)."""
    check: Callable[[str | None, str | None], None]
    """`check(rest, policy)`: what can be checked without loading weights (files and folders
    included); ValueError with what to pass instead."""
    check_form: Callable[[str | None], None]
    """`check_form(rest)`: the spec's form alone (no model file read): for a config whose models a
    later stage builds."""
    argument: str = "required"
    """What follows the colon: required, optional (a bare name reads --policy) or none."""
    reads_policy: bool = False
    """A bare spec of this kind reads the policy passed alongside it."""
    combines: bool = False
    """REST is two or more specs joined step by step (`product:A,B`)."""
    needs_world: bool = False
    """It checks steps against the world's own computation, so it scores world problems only."""
    trains_online: bool = False
    """PPO can keep training it on the run's own answer checks (`--verifier_online_update`)."""
    reference: bool = False
    """It knows every step's truth (privileged): results with it are an upper reference, never a method."""
    judges_steps: bool = False
    """Its step scores judge each step on its own (a language model's likelihood of the step), not the
    value of the path so far as a PSV's do: `--reward step` pays them raw with return credit by default
    (rl/ppo_checks.JUDGED_STEP_FORM)."""


VERIFIER_KINDS: dict[str, VerifierKind] = {}
"""Every verifier kind by name, in the order errors list them."""
PATH_KIND = "PATH"


class UnknownVerifierKindError(ValueError):
    """A spec that names no registered kind (and no existing folder)."""


def _no_check(*_: Any) -> None:
    return None


def register_verifier_kind(name: str, *, usage: str, argument: str = "required",
                           check: Callable[[str | None, str | None], None] | None = None,
                           check_form: Callable[[str | None], None] | None = None, reads_policy: bool = False,
                           combines: bool = False, needs_world: bool = False, trains_online: bool = False,
                           reference: bool = False, judges_steps: bool = False) -> Callable:
    """Register the decorated loader, `load(rest, ctx) -> Verifier`, as verifier kind `name`.
    `check` defaults to `check_form`, which defaults to requiring REST when `argument` is required."""
    if argument not in ("required", "optional", "none"):
        raise ValueError(f"argument must be required, optional or none, got {argument!r}")

    def register(load: Callable[[str | None, LoadContext], Verifier]):
        if name in VERIFIER_KINDS:
            raise ValueError(f"verifier kind {name!r} is registered twice")
        form = check_form or (_needs_rest(name) if argument == "required" else _no_check)

        def full_check(rest: str | None, policy: str | None) -> None:
            form(rest)
            if check is not None:
                check(rest, policy)

        VERIFIER_KINDS[name] = VerifierKind(name, usage, load, full_check, form, argument, reads_policy,
                                            combines, needs_world, trains_online, reference, judges_steps)
        return load

    return register


def _needs_rest(name: str) -> Callable[[str | None], None]:
    def check_form(rest: str | None) -> None:
        if not rest:
            raise ValueError(f"verifier {name + ':'!r}: name the model ({name}:PATH)")

    return check_form


def verifier_kinds() -> tuple[str, ...]:
    """The name of every registered kind."""
    return tuple(VERIFIER_KINDS)


def kinds_help() -> str:
    """Every kind as a spec of it is written, for errors and help texts."""
    return ", ".join(kind.usage for kind in VERIFIER_KINDS.values())


def resolve(spec: str) -> tuple[VerifierKind, str | None]:
    """The kind of `spec` and what follows its prefix: (`confidence`, None) for a bare `confidence`
    (a bare kind whose argument is required is refused by its checks), (PATH, spec) for a spec with no
    known prefix."""
    head, sep, rest = spec.partition(":")
    kind = VERIFIER_KINDS.get(head)
    if kind is not None and kind.name != PATH_KIND and not (sep and kind.argument == "none"):
        return kind, rest if sep else None
    return VERIFIER_KINDS[PATH_KIND], spec


def split_spec(spec: str) -> tuple[str, str | None]:
    """("confidence", "PATH") for "confidence:PATH"; (spec, None) when it has no known prefix."""
    kind, rest = resolve(spec)
    if kind.name == PATH_KIND or rest is None:
        return spec, None
    return kind.name, rest


def kinds_of(spec: str) -> list[VerifierKind]:
    """The kind of each part of a spec (one for a spec that does not combine), for the facts the
    registry holds (`needs_world`, `trains_online`, `reference`); ValueError for a bad combination."""
    return [resolve(part)[0] for part in spec_parts(spec)]


def judges_each_step(spec: str | None) -> bool:
    """Whether every part of a spec scores each step on its own (`VerifierKind.judges_steps`); False
    for a spec that does not resolve (the run's own checks report it)."""
    try:
        return bool(spec) and all(k.judges_steps for k in kinds_of(spec or ""))
    except ValueError:
        return False


def is_reference_spec(spec: str | None) -> bool:
    """Whether a spec is an upper reference: every part of it a privileged kind (`reference`: the
    world's exact checker)."""
    return bool(spec) and all(k.reference for k in kinds_of(spec or ""))


def spec_parts(spec: str) -> list[str]:
    """The parts of a combined spec (`product:A,B`); [spec] for any other."""
    kind, rest = resolve(spec)
    if not kind.combines:
        return [spec]
    parts = [p.strip() for p in (rest or "").split(",")]
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"verifier {spec!r}: {kind.name}: needs two or more comma-separated specs")
    for p in parts:
        if resolve(p)[0].combines:
            raise ValueError(f"verifier {spec!r}: combined specs do not nest")
    return parts


def map_spec_parts(spec: str, fn) -> str:
    """`spec` with `fn` applied to each of its parts (a combined spec keeps its rule)."""
    kind = resolve(spec)[0]
    if kind.combines:
        return f"{kind.name}:" + ",".join(fn(p) for p in spec_parts(spec))
    return fn(spec)


def pin_policy(spec: str, policy: str) -> str:
    """`spec` with every bare confidence part bound to `policy` (a fixed verifier across policies)."""

    def pin(part: str) -> str:
        kind, rest = resolve(part)
        return f"{kind.name}:{policy}" if kind.reads_policy and not rest else part

    return map_spec_parts(spec, pin)


def needs_policy(spec: str) -> bool:
    """Whether `spec` reads the probabilities of the policy passed alongside it."""
    return any(resolve(p)[0].reads_policy and not resolve(p)[1] for p in spec_parts(spec))


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
    kind, rest = resolve(spec)
    return kind.load(rest, LoadContext(policy, world_rows, batch_size, device))


def check_spec(spec: str, policy: str | None = None) -> None:
    """The checks of `load_verifier` that need no weights, so that a run can refuse a misspelt spec
    before it loads anything: ValueError with what to pass instead."""
    kind, rest = resolve(spec)
    kind.check(rest, policy)


def check_spec_form(spec: str) -> None:
    """A spec's form alone, every part a registered kind, reading no model file: for a config
    whose models a later stage builds. ValueError naming what is wrong."""
    kind, rest = resolve(spec)
    kind.check_form(rest)


# ---------------------------------------------------------------------------------------------
# The kinds.

CONFIDENCE_SPANS = {"confidence": "result", "step-confidence": "step", "step-likelihood": "step"}
CONFIDENCE_REDUCE = {"step-likelihood": "mean"}
"""How a confidence verifier reduces a span's token probabilities: `min` unless named here."""


def _register_confidence(name: str) -> None:
    def check(rest: str | None, policy: str | None) -> None:
        _confidence_policy(name, rest, policy)

    @register_verifier_kind(name, usage=f"{name}[:PATH]", argument="optional", reads_policy=True, check=check,
                            judges_steps=CONFIDENCE_SPANS[name] == "step")
    def load(rest: str | None, ctx: LoadContext) -> Verifier:
        path = _confidence_policy(name, rest, ctx.policy)
        from reward_models.confidence import ConfidenceVerifier

        return ConfidenceVerifier.from_pretrained(path, batch_size=ctx.batch_size, device=ctx.device,
                                                  span=CONFIDENCE_SPANS[name],
                                                  reduce=CONFIDENCE_REDUCE.get(name, "min"))


for _name in CONFIDENCE_SPANS:
    _register_confidence(_name)


def _world_rows(ctx: LoadContext) -> list[dict]:
    return [r for r in (ctx.world_rows or []) if isinstance(r, dict) and "world" in r]


@register_verifier_kind("exact", usage="exact", argument="none", needs_world=True, reference=True)
def _load_exact(rest: str | None, ctx: LoadContext) -> Verifier:
    rows = _world_rows(ctx)
    if not rows:
        raise ValueError("the exact verifier checks world problems only: evaluate on world data")
    from reward_models.exact import ExactVerifier

    return ExactVerifier.from_rows(rows)


def _check_noise(rest: str | None) -> None:
    from reward_models.exact_noisy import parse_noise_spec

    parse_noise_spec(rest)


@register_verifier_kind("exact-noisy", usage="exact-noisy:accept=A/kinds=K+K/reject=R/seed=S",
                        check_form=_check_noise, needs_world=True)
def _load_exact_noisy(rest: str | None, ctx: LoadContext) -> Verifier:
    from reward_models.exact_noisy import load

    return load(rest, ctx.world_rows)


def _check_implicit(rest: str | None, policy: str | None = None) -> None:
    from reward_models.implicit_prm import check_implicit_dir

    check_implicit_dir(rest or "")


def _check_implicit_form(rest: str | None) -> None:
    if not rest:
        raise ValueError("implicit: name the implicit PRM folder (implicit:PATH)")


@register_verifier_kind("implicit", usage="implicit:PATH", check_form=_check_implicit_form,
                        check=_check_implicit, trains_online=True)
def _load_implicit(rest: str | None, ctx: LoadContext) -> Verifier:
    from reward_models.implicit_prm import ImplicitPRM

    return ImplicitPRM.from_pretrained(rest or "", batch_size=ctx.batch_size, device=ctx.device)


def _register_family(name: str) -> None:
    """A published PRM family of `reward_models.prm_families` (one module each) as a kind."""

    def check(rest: str | None, policy: str | None) -> None:
        from reward_models.prm_families import get_family

        spec_path = get_family(name).spec_path
        check_model_path(f"verifier {name}:", spec_path(rest or "") if spec_path else rest or "")

    # the families are not imported here (torch); a served one (`*-http`) names its server too
    usage = f"{name}:PATH@URL" if name.endswith("-http") else f"{name}:PATH"

    @register_verifier_kind(name, usage=usage, check=check)
    def load(rest: str | None, ctx: LoadContext) -> Verifier:
        from reward_models.prm_families import get_family

        verifier = get_family(name).verifier(rest or "", batch_size=ctx.batch_size)
        # e.g. the PPO process's GPU: a 7B PRM must not score on the CPU. A family served by an engine
        # of its own (qwen-prm-vllm) holds no torch model and places itself.
        model = getattr(verifier, "model", None)
        if ctx.device is not None and model is not None:
            model.to(ctx.device)
        return verifier


for _name in FAMILY_NAMES:
    _register_family(_name)


def _check_auto(rest: str | None, policy: str | None) -> None:
    check_model_path("verifier auto:", rest or "")
    recognise_spec(rest or "", say=False)


@register_verifier_kind("auto", usage="auto:PATH", check=_check_auto)
def _load_auto(rest: str | None, ctx: LoadContext) -> Verifier:
    return load_verifier(recognise_spec(rest or ""), ctx.policy, world_rows=ctx.world_rows,
                         batch_size=ctx.batch_size, device=ctx.device)


def _register_combination(rule: str) -> None:
    def parts(rest: str | None) -> list[str]:
        return spec_parts(f"{rule}:{rest or ''}")

    def check_form(rest: str | None) -> None:
        for part in parts(rest):
            check_spec_form(part)

    def check(rest: str | None, policy: str | None) -> None:
        for part in parts(rest):
            check_spec(part, policy)

    @register_verifier_kind(rule, usage=f"{rule}:SPEC,SPEC[,...]", check_form=check_form, check=check,
                            combines=True)
    def load(rest: str | None, ctx: LoadContext) -> Verifier:
        from reward_models.combined import CombinedVerifier

        return CombinedVerifier([load_verifier(p, ctx.policy, world_rows=ctx.world_rows,
                                               batch_size=ctx.batch_size, device=ctx.device)
                                 for p in parts(rest)], rule=rule)


for _name in ("product", "min"):
    _register_combination(_name)
COMBINE_RULES = tuple(name for name, kind in VERIFIER_KINDS.items() if kind.combines)


def _check_path_form(path: str | None) -> None:
    where = Path(path or "").expanduser()
    if not where.is_dir():
        _unknown(path or "", "not a directory" if where.exists() else "no such directory")


def _check_path(path: str | None, policy: str | None) -> None:
    if _published_prm_spec(path or "") is not None:
        recognise_spec(path or "", say=False)  # the folder's files checked, as for auto:PATH
    else:
        _check_psv_dir(path or "")


@register_verifier_kind(PATH_KIND, usage="PATH (a PSV folder, or a published PRM of its own architecture)",
                        check_form=_check_path_form, check=_check_path)
def _load_path(path: str | None, ctx: LoadContext) -> Verifier:
    spec = path or ""
    if _published_prm_spec(spec) is not None:
        return load_verifier(f"auto:{spec}", ctx.policy, world_rows=ctx.world_rows, batch_size=ctx.batch_size,
                             device=ctx.device)
    _check_psv_dir(spec)
    from reward_models.psv import PSVVerifier

    return PSVVerifier.from_pretrained(spec, batch_size=ctx.batch_size, device=ctx.device)


def _unknown(spec: str, why: str) -> None:
    """UnknownVerifierKindError for a spec that is no kind and no folder, listing every kind."""
    head, sep, _ = spec.partition(":")
    named = f", and {head!r} is no verifier kind" if sep and head not in VERIFIER_KINDS else ""
    raise UnknownVerifierKindError(f"verifier {spec!r}: {why}{named}; a verifier spec is one of: "
                                   f"{kinds_help()}")


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
            f"published causal-LM PRM is named by its family: `rlhflow-prm:{spec}`, `math-shepherd:{spec}` or "
            f"`auto:{spec}`"
        )
    if not Path(spec).exists():
        _unknown(spec, "no such directory")
    raise ValueError(f"verifier {spec!r}: not a PSV directory (psv_config.json, adapter_config.json or a "
                     f"token-classification config.json); a verifier spec is one of: {kinds_help()}")
