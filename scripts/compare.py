#!/usr/bin/env python
"""Policies × inference methods on the same problems: do step-PPO and verify-then-revise help,
separately and together, and at what cost?

    python scripts/compare.py [--config configs/compare/tiny_world.yaml] --out DIR [--quick]
        [--n_problems N] [--cache_dir D] [--workers W] [--set section.key=value ...]

1. **Artefacts**, trained or reused: the SFT policy (`rl.sft`, with the revise, clarify and verify
   tasks that StepCo and BEATS prompt for), the PSV (StepCo-tree annotation of the SFT policy's
   paths, then `reward_models.train`), and one PPO policy per entry of `ppo.runs` (outcome- and
   step-PPO by default, `rl/ppo_step.py`, the same budget for both). Each lives in
   `<cache_dir>/<kind>-<hash>/`, the hash taken over the config entries that define it and the
   hashes of what it is built from; a directory with its `compare_artefact.json` marker is reused,
   one without it is resumed (annotation, PPO checkpoints) or rebuilt (SFT). A config entry `path`
   uses an existing policy or verifier instead (a Hub model on GPUs).
2. **Evaluation**: every policy with every method of `eval.methods` (greedy, self-consistency,
   Best-of-N, StepCo, BEATS) through `inference.evaluate.evaluate`, on the same problems, with the
   same seeds and the same verifier, into `DIR/eval/<policy>/<method>/` (resumable per chunk).
   Optionally StepCo with the world's exact checker, labelled as an upper reference.
3. **Report**: `DIR/report.md`, `DIR/summary.json` and `DIR/accuracy_vs_tokens.png`: accuracy
   with its 95% bootstrap interval, generator and verifier tokens, LLM calls and wall time per
   cell; paired effects (PPO vs SFT, StepCo vs greedy, both together); StepCo's answer changes
   between its initial path and its final answer (StepCo's Figure 4); accuracy against tokens for
   self-consistency and Best-of-N at N = 1, 2, 4, ... (read from one run at the largest N),
   StepCo at T = 1..max_rounds (read from one run's per-round trace) and BEATS.

`--quick` merges `configs/compare/quick.yaml` over the config: a smoke run of every stage.
With `workers` > 1 the two PPO runs, then the per-policy evaluations, run as parallel
subprocesses (logs in `DIR/logs/`). Progress goes to stderr; nothing is lost on a kill: a re-run
with the same `--out` resumes every stage.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/compare.py` from anywhere
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_CONFIG = ROOT / "configs" / "compare" / "tiny_world.yaml"
QUICK_CONFIG = ROOT / "configs" / "compare" / "quick.yaml"
CACHE_VERSION = 1
"""Part of every artefact hash: bump it when a change of this script changes what it trains."""
MARKER = "compare_artefact.json"
CELL_KEY = "compare_cell.json"
RESOLVED = "compare_config.json"
BUDGET_KEYS = ("num_updates", "prompts_per_update", "samples_per_prompt", "n_prompts", "max_new_tokens", "seed",
               "dataset", "temperature")
"""PPO flags that make up the budget: the same for every PPO run."""
NEEDS_NO_VERIFIER = ("greedy", "self_consistency")
REFERENCE = "stepco_exact"
METHOD_NAMES = {"greedy": "greedy", "self_consistency": "self-consistency", "best_of_n": "Best-of-N",
                "stepco": "StepCo", "pathco": "PathCo", "beats": "BEATS", REFERENCE: "StepCo + exact checker (reference)"}
POLICY_NAMES = {"sft": "SFT", "outcome_ppo": "outcome-PPO", "step_ppo": "step-PPO"}


class CompareError(ValueError):
    """A config, artefact or stage this script cannot work with; the message says which."""


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# configuration: nested dataclasses, one docstring per field (configs/compare/tiny_world.yaml
# writes every default out)


def _sft_args() -> dict[str, Any]:
    return {"arch": "llama", "hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 1024,
            "n_train": 30000, "n_eval": 200, "world_seed": 0,
            "tasks": "solve=1.0,explore=0.1,revise=0.2,clarify=0.05,verify=0.1", "learning_rate": 0.002,
            "lr_scheduler_type": "cosine", "warmup_steps": 0.03, "per_device_train_batch_size": 32,
            "num_train_epochs": 1, "max_new_tokens": 160, "seed": 0, "report_to": "none", "disable_tqdm": False}


def _ppo_args() -> dict[str, Any]:
    return {"num_updates": 60, "prompts_per_update": 16, "samples_per_prompt": 4, "n_prompts": 4000,
            "max_new_tokens": 128, "seed": 0, "eval_dataset": "none", "save_steps": 20, "report_to": "none",
            "disable_tqdm": False}


def _methods() -> dict[str, dict[str, Any]]:
    return {
        "greedy": {"max_new_tokens": 192},
        "self_consistency": {"n": 16, "temperature": 0.8, "max_new_tokens": 192},
        "best_of_n": {"n": 16, "temperature": 0.8, "aggregation": "mean", "max_new_tokens": 192},
        "stepco": {"max_rounds": 5, "threshold": 0.175, "revision": "prompt", "max_new_tokens": 192},
        "beats": {"max_depth": 7, "max_forward_steps": 5, "branching": 2, "width": 8, "temperature": 0.7},
    }


@dataclass
class SFTSection:
    path: str | None = None
    """An existing policy directory used as the SFT policy instead of training one (null: train)."""
    args: dict[str, Any] = field(default_factory=_sft_args)
    """Flags of `python -m rl.sft`; compare sets --output_dir."""


@dataclass
class PSVSection:
    path: str | None = None
    """An existing verifier spec (PSV directory, confidence, math-shepherd:PATH, ...) instead of training one."""
    n_problems: int = 300
    """World train problems annotated with StepCo's tree."""
    annotate: dict[str, Any] = field(default_factory=lambda: {"method": "tree", "seed": 1, "disable_tqdm": True})
    """Fields of reward_models.annotate.AnnotateConfig (policy, out, n set by compare)."""
    train: dict[str, Any] = field(default_factory=lambda: {"num_train_epochs": 2.0, "learning_rate": 1e-3,
                                                           "per_device_train_batch_size": 16, "seed": 0})
    """Keyword arguments of reward_models.train.train_verifier (init_from, output_dir set by compare)."""
    combine_with: str | None = "step-confidence"
    """Another verifier spec joined with the PSV step by step, e.g. `step-confidence` (a bare
    confidence spec reads the SFT policy); the joined verifier is then used everywhere (PPO rewards
    and every method). null: the PSV alone."""
    combine_rule: str = "product"
    """How the two are joined: product or min (reward_models.combined)."""


@dataclass
class PPORun:
    reward: str = "step"
    """rl/ppo_step.py --reward: step, outcome, gold or step+gold."""
    path: str | None = None
    """An existing trained policy directory instead of training (null: train)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Flags of this run only; the budget flags may not differ between runs."""


@dataclass
class PPOSection:
    args: dict[str, Any] = field(default_factory=_ppo_args)
    """Flags of rl/ppo_step.py shared by every run (the budget)."""
    runs: dict[str, PPORun] = field(default_factory=lambda: {"outcome_ppo": PPORun(reward="outcome"),
                                                             "step_ppo": PPORun(reward="step")})
    """The PPO policies by name."""


@dataclass
class EvalSection:
    dataset: str = "world"
    """world, world:dev, a benchmark name (gsm8k, math500, ...) or a .jsonl file."""
    n_problems: int = 200
    """Problems evaluated (the first n)."""
    world_seed: int = 0
    """Seed of the world problems."""
    data_dir: str | None = None
    """Folder of benchmark files (null: $STEPRL_DATA_DIR or ../shared/data)."""
    source: str = "auto"
    """Benchmark source: auto, local or hub."""
    backend: str = "hf"
    """Generator backend: hf, vllm or openai."""
    backend_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the backend."""
    batch_size: int = 64
    """Sequences per generation batch (hf)."""
    verifier_batch_size: int = 32
    """Paths per verifier forward pass."""
    device: str | None = None
    """Device of local models (null: cuda when available)."""
    chunk_size: int = 50
    """Problems per method call (results saved after each)."""
    seed: int = 0
    """Seed of every method in every cell."""
    bootstrap_samples: int = 1000
    """Resamples of the bootstrap intervals."""
    verifier: str | None = None
    """Verifier spec of the methods (null: the PSV)."""
    methods: dict[str, dict[str, Any]] = field(default_factory=_methods)
    """Method module name -> options of its Config."""
    reference_exact: bool = True
    """Also run StepCo with the exact checker (world only), as an upper reference."""
    curve_n: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """N of the self-consistency and Best-of-N points of the plot."""
    threshold_dev_problems: int | None = 100
    """StepCo's θ calibrated for earliest-error F1 on the SFT policy's greedy paths of this many
    world *dev* problems (disjoint from the test problems), labelled by the world's checker; it
    replaces methods.stepco.threshold for every policy (one verifier, one θ). null: the threshold
    as written. World evaluation only."""


@dataclass
class CompareConfig:
    cache_dir: str = "outputs/compare_cache"
    """Where trained artefacts are cached, by hash."""
    rebuild_on_code_change: bool = False
    """Also hash the source files that build each artefact (a code change retrains it); False: reuse
    and warn."""
    workers: int = 2
    """Stages run side by side (1: everything in this process)."""
    launcher: str | None = None
    """Command prefix that starts training scripts (e.g. accelerate launch ...); null: python."""
    policies: list[str] = field(default_factory=lambda: ["sft", "outcome_ppo", "step_ppo"])
    """Policies compared, in table order; the first is the base of the effects."""
    sft: SFTSection = field(default_factory=SFTSection)
    psv: PSVSection = field(default_factory=PSVSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    eval: EvalSection = field(default_factory=EvalSection)


def _plain(value: Any) -> Any:
    """A dataclass config as nested dicts (JSON-ready)."""
    return json.loads(json.dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value))


def deep_merge(base: Any, over: Any) -> Any:
    """`over` merged into `base`: mappings key by key (recursively), everything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _build(cls: type, values: Any, where: str) -> Any:
    """An instance of dataclass `cls` from a mapping, with errors naming the config key."""
    if not isinstance(values, dict):
        raise CompareError(f"{where or 'the config'}: expected a mapping, got {type(values).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise CompareError(f"unknown config key {where + '.' if where else ''}{unknown[0]}; "
                           f"known: {', '.join(names)}")
    kwargs: dict[str, Any] = {}
    nested = {"sft": SFTSection, "psv": PSVSection, "ppo": PPOSection, "eval": EvalSection}
    for name, value in values.items():
        key = f"{where}.{name}" if where else name
        if cls is CompareConfig and name in nested:
            kwargs[name] = _build(nested[name], value, key)
        elif cls is PPOSection and name == "runs":
            if not isinstance(value, dict) or not value:
                raise CompareError(f"{key}: expected a mapping of run names to runs")
            kwargs[name] = {run: _build(PPORun, spec or {}, f"{key}.{run}") for run, spec in value.items()
                            if spec is not None}
        elif cls is EvalSection and name == "methods":
            if not isinstance(value, dict):
                raise CompareError(f"{key}: expected a mapping of method names to options")
            kwargs[name] = {m: dict(opts or {}) for m, opts in value.items() if opts is not None}
        else:
            _check_type(cls, name, value, key)
            kwargs[name] = value
    return cls(**kwargs)


def _check_type(cls: type, name: str, value: Any, key: str) -> None:
    """A clear error for a config value of the wrong type (null is allowed where the type is optional)."""
    import types
    import typing

    hint = typing.get_type_hints(cls).get(name)
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return
    ok = False
    for tp in allowed:
        origin = typing.get_origin(tp) or tp
        if origin is float:
            ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool))
        elif origin is int:
            ok = ok or (isinstance(value, int) and not isinstance(value, bool))
        elif origin in (str, bool, list, dict):
            ok = ok or isinstance(value, origin)
    if not ok:
        raise CompareError(f"{key}: expected {hint}, got {value!r}")


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise CompareError(f"--config {path}: no such file") from None
    except yaml.YAMLError as e:
        raise CompareError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{path}: expected a mapping at the top level")
    return data


def parse_set(item: str) -> dict[str, Any]:
    """`a.b.c=value` (the value read as YAML) as a nested mapping."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise CompareError(f"--set {item!r}: expected section.key=value")
    value = yaml.safe_load(raw) if raw.strip() else None
    out: dict[str, Any] = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, quick: bool = False, sets: Sequence[str] = (),
                overrides: dict[str, Any] | None = None) -> CompareConfig:
    """The embedded default, then the file, the quick overlay, `--set` items and `overrides`."""
    values = _plain(CompareConfig())
    if path is not None:
        values = deep_merge(values, _read_yaml(Path(path)))
    if quick:
        values = deep_merge(values, _read_yaml(QUICK_CONFIG))
    for item in sets:
        values = deep_merge(values, parse_set(item))
    if overrides:
        values = deep_merge(values, overrides)
    config = _build(CompareConfig, values, "")
    validate(config)
    return config


def validate(cfg: CompareConfig) -> None:
    from inference.evaluate import load_method

    if cfg.workers < 1:
        raise CompareError(f"workers must be >= 1, got {cfg.workers}")
    if not cfg.policies:
        raise CompareError("policies: name at least one policy")
    known = {"sft", *cfg.ppo.runs}
    for name in cfg.policies:
        if name not in known:
            raise CompareError(f"policies: {name!r} is neither 'sft' nor a run of ppo.runs ({', '.join(cfg.ppo.runs)})")
    if len(set(cfg.policies)) != len(cfg.policies):
        raise CompareError("policies: a policy is named twice")
    for name, run in cfg.ppo.runs.items():
        clash = sorted(set(run.args) & set(BUDGET_KEYS))
        if clash:
            raise CompareError(f"ppo.runs.{name}.args.{clash[0]}: a budget flag; set it in ppo.args so every "
                               "PPO run has the same budget")
        for key in ("policy", "verifier", "output_dir", "reward"):
            if key in run.args or key in cfg.ppo.args:
                raise CompareError(f"ppo args: {key} is set by compare (use ppo.runs.<name>.reward, sft.path, psv.path)")
    if "output_dir" in cfg.sft.args:
        raise CompareError("sft.args.output_dir is set by compare (use sft.path for an existing policy)")
    if cfg.psv.combine_with is not None:
        from reward_models.load import COMBINE_RULES, split_spec

        if cfg.psv.combine_rule not in COMBINE_RULES:
            raise CompareError(f"psv.combine_rule must be one of {', '.join(COMBINE_RULES)}, "
                               f"got {cfg.psv.combine_rule!r}")
        if not str(cfg.psv.combine_with).strip() or split_spec(cfg.psv.combine_with)[0] in COMBINE_RULES:
            raise CompareError(f"psv.combine_with must be one verifier spec, got {cfg.psv.combine_with!r}")
    ev = cfg.eval
    if not ev.dataset.startswith("world"):
        for what, data in (("ppo.args.dataset", cfg.ppo.args.get("dataset", "world")),
                           ("psv.annotate.data", cfg.psv.annotate.get("data", "world"))):
            if str(data) == ev.dataset:
                raise CompareError(f"{what} is the evaluation set ({ev.dataset}): training would see the problems "
                                   "it is evaluated on; give it a train split (e.g. a .jsonl file)")
    if ev.n_problems < 1:
        raise CompareError(f"eval.n_problems must be >= 1, got {ev.n_problems}")
    if ev.threshold_dev_problems is not None:
        if ev.threshold_dev_problems < 2:
            raise CompareError(f"eval.threshold_dev_problems must be >= 2 or null, got {ev.threshold_dev_problems}")
        if not ev.dataset.startswith("world"):
            raise CompareError("eval.threshold_dev_problems calibrates on world dev paths: set it to null and "
                               "give eval.methods.stepco.threshold for other datasets")
    if ev.chunk_size < 1 or ev.batch_size < 1 or ev.bootstrap_samples < 1:
        raise CompareError("eval.chunk_size, eval.batch_size and eval.bootstrap_samples must be >= 1")
    if not ev.methods:
        raise CompareError("eval.methods: name at least one method")
    for method, options in ev.methods.items():
        if method == REFERENCE:
            raise CompareError(f"eval.methods: {REFERENCE} is the reference row, set eval.reference_exact")
        try:
            method_config(load_method(method), options, ev.seed)
        except (TypeError, ValueError) as e:
            raise CompareError(f"eval.methods.{method}: {e}") from None
    if any(not isinstance(n, int) or n < 1 for n in ev.curve_n):
        raise CompareError(f"eval.curve_n must be positive integers, got {ev.curve_n}")


def method_config(module, options: dict[str, Any], seed: int):
    """The method's Config from config options, with the shared seed."""
    fields = {f.name for f in dataclasses.fields(module.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; options: {', '.join(sorted(fields))}")
    values = dict(options)
    if "seed" in fields:
        values["seed"] = seed
    return module.Config(**values)


# ----------------------------------------------------------------------------------------------
# artefacts: what is trained, where it is cached


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Artefact:
    name: str
    """sft, psv or a PPO run name."""
    kind: str
    """sft, psv or ppo."""
    key: dict[str, Any]
    """What the hash covers (the config entries and the refs of the inputs)."""
    dir: Path
    given: bool
    """A path from the config: used as it is, never trained here."""
    given_spec: str | None = None
    """The config's path or verifier spec, for a given artefact."""

    @property
    def hash(self) -> str:
        return digest(self.key)

    @property
    def ref(self) -> str:
        """What names this artefact in the key of anything built from it."""
        return f"{self.kind}-{self.hash}" if not self.given else str(self.spec)

    @property
    def spec(self) -> str:
        """The policy directory or verifier spec that other stages load."""
        if self.given:
            return str(self.given_spec)
        return str({"sft": self.dir, "psv": self.dir / "verifier", "ppo": self.dir / "policy"}[self.kind])

    def complete(self) -> bool:
        if self.given:
            return True
        return (self.dir / MARKER).exists() and (Path(self.spec) / "config.json").exists()

    def marker(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / MARKER).read_text())
        except (OSError, json.JSONDecodeError):
            return {}


CODE = {
    "sft": ("rl/sft.py", "rl/models.py", "reasoning/corpora.py", "reasoning/tokenizer.py", "reasoning/world.py",
            "reasoning/prompts.py"),
    "psv": ("reward_models/annotate.py", "reward_models/train.py", "reward_models/psv.py"),
    "ppo": ("rl/ppo_config.py", "rl/ppo_setup.py", "rl/ppo_step.py", "rl/ppo_trainer.py", "rl/ppo_math.py",
            "rl/step_rewards.py"),
}
"""The source files that decide what each kind of artefact becomes (their defaults included)."""


def code_digest(kind: str) -> str:
    h = hashlib.sha256()
    for rel in CODE[kind]:
        path = ROOT / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>") + b"\0")
    return h.hexdigest()[:12]


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if Path(path).expanduser().exists() else path


def artefacts(cfg: CompareConfig) -> dict[str, Artefact]:
    """The SFT policy, the PSV and every PPO run named in `policies`, with their cache directories."""
    cache = Path(cfg.cache_dir)
    out: dict[str, Artefact] = {}
    if cfg.sft.path:
        sft = Artefact("sft", "sft", {"path": _abs(cfg.sft.path)}, Path(_abs(cfg.sft.path)), True, _abs(cfg.sft.path))
    else:
        key = {"kind": "sft", "version": CACHE_VERSION, "args": cfg.sft.args, "launcher": cfg.launcher}
        if cfg.rebuild_on_code_change:
            key["code"] = code_digest("sft")
        sft = Artefact("sft", "sft", key, cache / f"sft-{digest(key)}", False)
    out["sft"] = sft
    if cfg.psv.path:
        spec = cfg.psv.path
        psv = Artefact("psv", "psv", {"path": _abs(spec)}, Path(_abs(spec)), True, _abs(spec))
    else:
        key = {"kind": "psv", "version": CACHE_VERSION, "policy": sft.ref, "n_problems": cfg.psv.n_problems,
               "annotate": cfg.psv.annotate, "train": cfg.psv.train}
        if cfg.rebuild_on_code_change:
            key["code"] = code_digest("psv")
        psv = Artefact("psv", "psv", key, cache / f"psv-{digest(key)}", False)
    out["psv"] = psv
    for name, run in cfg.ppo.runs.items():
        if name not in cfg.policies:
            continue
        if run.path:
            out[name] = Artefact(name, "ppo", {"path": _abs(run.path)}, Path(_abs(run.path)), True, _abs(run.path))
            continue
        args = {**cfg.ppo.args, **run.args}
        key = {"kind": "ppo", "version": CACHE_VERSION, "reward": run.reward, "args": args, "policy": sft.ref,
               "verifier": verifier_spec(cfg, out, ref=True), "launcher": cfg.launcher}
        if cfg.rebuild_on_code_change:
            key["code"] = code_digest("ppo")
        out[name] = Artefact(name, "ppo", key, cache / f"ppo-{run.reward.replace('+', '_')}-{digest(key)}", False)
    return out


def verifier_spec(cfg: CompareConfig, arts: dict[str, Artefact], ref: bool = False) -> str:
    """The verifier every stage loads: the PSV, joined with `psv.combine_with` when set; confidence
    specs are bound to the SFT policy, so every policy is judged by the same verifier. With `ref`,
    the same made of artefact refs (what cache keys and cell keys hold)."""
    from reward_models.load import pin_policy

    psv, sft = (arts["psv"].ref, arts["sft"].ref) if ref else (arts["psv"].spec, arts["sft"].spec)
    spec = psv if cfg.psv.combine_with is None else f"{cfg.psv.combine_rule}:{cfg.psv.combine_with},{psv}"
    return pin_policy(spec, sft)


def methods_verifier_spec(cfg: CompareConfig, arts: dict[str, Artefact], ref: bool = False) -> str:
    """The verifier of the methods: `eval.verifier` (bound to the SFT policy) when set, else
    `verifier_spec`."""
    from reward_models.load import pin_policy

    if cfg.eval.verifier:
        return pin_policy(cfg.eval.verifier, arts["sft"].ref if ref else arts["sft"].spec)
    return verifier_spec(cfg, arts, ref)


def to_argv(args: dict[str, Any]) -> list[str]:
    """A mapping as command-line flags (booleans as true/false; None means the script's default)."""
    argv = []
    for k, v in args.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        argv += [f"--{k}", str(v)]
    return argv


def _write_marker(art: Artefact, seconds: float, extra: dict[str, Any] | None = None) -> None:
    info = {"kind": art.kind, "name": art.name, "hash": art.hash, "key": art.key, "code": code_digest(art.kind),
            "seconds": round(seconds, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **(extra or {})}
    tmp = art.dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, art.dir / MARKER)


def sft_command(cfg: CompareConfig, art: Artefact) -> list[str]:
    argv = to_argv(cfg.sft.args) + ["--output_dir", str(art.dir)]
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, "-m", "rl.sft", *argv]


def ppo_argv(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    run = cfg.ppo.runs[name]
    art = arts[name]
    threads = []
    if "num_threads" not in cfg.ppo.args and "num_threads" not in run.args:
        # PPO runs side by side share the cores: one torch thread each; a run alone may use them all
        threads = ["--num_threads", "1" if cfg.workers > 1 else "0"]
    return to_argv({**cfg.ppo.args, **run.args}) + [
        "--reward", run.reward, "--policy", arts["sft"].spec, "--verifier", verifier_spec(cfg, arts),
        "--output_dir", str(art.dir), "--build_missing", "false", "--resume_from_checkpoint", "auto", *threads]


def ppo_command(cfg: CompareConfig, name: str, arts: dict[str, Artefact]) -> list[str]:
    prefix = shlex.split(cfg.launcher) if cfg.launcher else [sys.executable]
    return [*prefix, str(ROOT / "rl" / "ppo_step.py"), *ppo_argv(cfg, name, arts)]


def build_sft(cfg: CompareConfig, art: Artefact, log_dir: Path) -> None:
    start = time.time()
    if art.dir.exists():
        log(f"sft: {art.dir} is incomplete (no {MARKER}); training it again from the start")
        shutil.rmtree(art.dir)
    art.dir.mkdir(parents=True)
    log(f"sft: training the SFT policy into {art.dir} (tasks {cfg.sft.args.get('tasks')}, "
        f"{cfg.sft.args.get('n_train')} problems)")
    if cfg.launcher:
        run_logged(sft_command(cfg, art), log_dir / "sft.log", "sft")
    else:
        from rl import sft

        code = sft.main(to_argv(cfg.sft.args) + ["--output_dir", str(art.dir)])
        if code:
            raise CompareError(f"rl.sft failed with exit code {code}")
    extra = {}
    try:
        ev = json.loads((art.dir / "eval.json").read_text())
        extra = {"greedy_accuracy": ev.get("greedy_accuracy"), "n_eval": ev.get("n"),
                 "train_seconds": ev.get("train_seconds")}
    except (OSError, json.JSONDecodeError):
        pass
    _write_marker(art, time.time() - start, extra)
    log(f"sft: ready in {time.time() - start:.0f}s ({extra})")


def build_psv(cfg: CompareConfig, art: Artefact, policy: str) -> None:
    from reward_models.annotate import AnnotateConfig, annotate
    from reward_models.train import train_verifier

    start = time.time()
    art.dir.mkdir(parents=True, exist_ok=True)
    rows_path = art.dir / "annotation.jsonl"
    settings = {**cfg.psv.annotate, "policy": policy, "out": str(rows_path), "n": cfg.psv.n_problems}
    log(f"psv: annotating {cfg.psv.n_problems} problems of {settings.get('data', 'world')} ({settings.get('method', 'tree')}) "
        f"into {rows_path} (resumes)")
    try:
        summary = annotate(AnnotateConfig(**settings))
    except TypeError as e:
        raise CompareError(f"psv.annotate: {e}") from None
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    if not rows:
        raise CompareError(f"psv: the annotation of {cfg.psv.n_problems} problems gave no paths "
                           f"(see {rows_path}.summary.json); raise psv.n_problems or train the SFT policy longer")
    verifier_dir = art.dir / "verifier"
    if verifier_dir.exists():
        shutil.rmtree(verifier_dir)
    log(f"psv: training the PSV on {len(rows)} annotated paths into {verifier_dir}")
    try:
        train_verifier(rows, init_from=policy, output_dir=str(verifier_dir), **cfg.psv.train)
    except TypeError as e:
        raise CompareError(f"psv.train: {e}") from None
    _write_marker(art, time.time() - start, {"paths": len(rows), "annotation": {
        k: summary.get(k) for k in ("problems", "rows", "steps", "mean_label", "seconds") if k in summary}})
    log(f"psv: ready in {time.time() - start:.0f}s")


def build_ppo_inline(cfg: CompareConfig, name: str, arts: dict[str, Artefact], log_dir: Path) -> None:
    """One PPO run from this process: in it, or through `launcher` when one is set."""
    if cfg.launcher:
        run_logged(ppo_command(cfg, name, arts), log_dir / f"ppo_{name}.log", f"ppo_{name}")
        return
    from rl import ppo_step

    log(f"{name}: training PPO (reward {cfg.ppo.runs[name].reward}) into {arts[name].dir}; resumes from its "
        "checkpoints")
    code = ppo_step.main(ppo_argv(cfg, name, arts))
    if code:
        raise CompareError(f"rl/ppo_step.py ({name}) failed with exit code {code}")


def finish_ppo(art: Artefact) -> None:
    """Check the PPO run's policy and write its marker (build time: the run's own train_seconds)."""
    extra: dict[str, Any] = {}
    try:
        ev = json.loads((art.dir / "eval.json").read_text())
        extra = {k: ev.get(k) for k in ("updates", "responses_per_update", "train_seconds", "greedy_accuracy_before",
                                         "greedy_accuracy_after") if k in ev}
    except (OSError, json.JSONDecodeError):
        pass
    if not (Path(art.spec) / "config.json").exists():
        raise CompareError(f"{art.name}: PPO finished but wrote no policy in {art.spec}")
    _write_marker(art, float(extra.get("train_seconds") or 0.0), extra)


# ----------------------------------------------------------------------------------------------
# running stages: in this process (workers 1) or as parallel subprocesses


def run_logged(cmd: list[str], log_path: Path, name: str) -> None:
    """Run `cmd` with its output in `log_path`; raise with the log's tail when it fails."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log(f"{name}: started (log: {log_path})")
    with log_path.open("ab") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n".encode())
        fh.flush()
        # the same working directory as this process, so that relative paths mean the same there
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        code = proc.wait()
    if code:
        raise CompareError(f"{name} failed with exit code {code}; the end of {log_path}:\n{_tail(log_path, 3000)}")
    log(f"{name}: done")


def _tail(path: Path, chars: int) -> str:
    try:
        data = path.read_bytes()[-chars:].decode(errors="replace")
    except OSError:
        return ""
    return data.replace("\r", "\n")


def _last_line(path: Path) -> str:
    lines = [x.strip() for x in _tail(path, 2000).splitlines() if x.strip()]
    return lines[-1][-160:] if lines else ""


@dataclass
class Job:
    name: str
    inline: Callable[[], None]
    """The work, in this process."""
    command: list[str] | None
    """The same work as a subprocess (None: always in this process)."""
    after: list[str] = field(default_factory=list)
    finish: Callable[[], None] | None = None
    """Run in this process after the work succeeded (e.g. writing an artefact's marker)."""


def run_jobs(jobs: list[Job], workers: int, log_dir: Path, heartbeat: float = 60.0) -> None:
    """Run `jobs` (each after the jobs it names) on `workers` slots; report progress to stderr."""
    if workers <= 1:
        for job in jobs:
            job.inline()
            if job.finish:
                job.finish()
        return
    events = {job.name: threading.Event() for job in jobs}
    failed: list[BaseException] = []
    running: dict[str, Path] = {}
    lock = threading.Lock()

    def work(job: Job) -> None:
        for dep in job.after:
            if dep in events:
                events[dep].wait()
        try:
            if failed:
                return
            if job.command is None:
                job.inline()
            else:
                path = log_dir / f"{job.name}.log"
                with lock:
                    running[job.name] = path
                try:
                    run_logged(job.command, path, job.name)
                finally:
                    with lock:
                        running.pop(job.name, None)
            if job.finish:
                job.finish()
        except BaseException as e:  # noqa: BLE001 - reported after every job stopped
            failed.append(e)
        finally:
            events[job.name].set()

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat):
            with lock:
                items = list(running.items())
            for name, path in items:
                log(f"{name}: {_last_line(path)}")

    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(work, jobs))
    finally:
        stop.set()
    if failed:
        raise failed[0]


# ----------------------------------------------------------------------------------------------
# evaluation


def load_eval_problems(ev: EvalSection, sft_dir: str):
    """The evaluation problems and, for world problems, their rows (the exact checker reads them)."""
    if ev.dataset == "world" or ev.dataset.startswith("world:"):
        from reasoning.world import generate, row_to_problem, world_config_of

        split = ev.dataset.split(":", 1)[1] if ":" in ev.dataset else "test"
        rows = generate(split, ev.n_problems, ev.world_seed, world_config_of(sft_dir if Path(sft_dir).is_dir() else None))
        return [row_to_problem(r) for r in rows], rows
    from inference.evaluate import world_rows_of
    from reasoning.benchmarks import load_benchmark

    problems = list(load_benchmark(ev.dataset, data_dir=ev.data_dir, limit=ev.n_problems, source=ev.source))
    return problems, world_rows_of(problems)


def cells(cfg: CompareConfig, world: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, method module, options) of every cell of one policy, the reference last."""
    out = [(m, m, opts) for m, opts in cfg.eval.methods.items()]
    if cfg.eval.reference_exact and world and "stepco" in cfg.eval.methods:
        out.append((REFERENCE, "stepco", cfg.eval.methods["stepco"]))
    return out


def eval_groups(cfg: CompareConfig, world: bool, workers: int) -> list[list[str]]:
    """The cells of one policy split into evaluation jobs: one job with one worker; with more, BEATS
    (about half of a policy's evaluation time on the world) apart from the other methods, so that
    the last policy's evaluation does not leave cores idle while it runs alone."""
    labels = [label for label, _, _ in cells(cfg, world)]
    if workers <= 1:
        return [labels]
    heavy = [x for x in labels if x == "beats"]
    rest = [x for x in labels if x not in heavy]
    return [g for g in (heavy, rest) if g]


def evaluate_policy(cfg: CompareConfig, policy_name: str, out: Path, labels: Sequence[str] | None = None) -> None:
    """Every method (and the reference) on one policy, into out/eval/<policy>/<label>/ (resumable);
    only the cells named in `labels` when given."""
    from inference.evaluate import (
        _Lazy,
        build_generator,
        evaluate,
        load_method,
        problems_fingerprint,
        read_results,
    )
    from reward_models.load import load_verifier

    arts = artefacts(cfg)
    ev = cfg.eval
    policy = arts[policy_name].spec
    for art in (arts["sft"], arts[policy_name]) + ((arts["psv"],) if ev.verifier is None else ()):
        if not art.complete():
            raise CompareError(f"evaluating {policy_name}: the {art.name} artefact in {art.dir} is not complete")
    problems, world_rows = load_eval_problems(ev, arts["sft"].spec)
    fingerprint = problems_fingerprint(problems)
    ids = {p.id for p in problems}
    spec = methods_verifier_spec(cfg, arts)
    generator = _Lazy(lambda: build_generator(ev.backend, policy, batch_size=ev.batch_size, device=ev.device,
                                              **ev.backend_options), "generator")
    verifier = _Lazy(lambda: load_verifier(spec, policy, world_rows=world_rows, batch_size=ev.verifier_batch_size,
                                           device=ev.device), "verifier")
    exact = None
    try:
        for label, method, options in cells(cfg, bool(world_rows)):
            if labels is not None and label not in labels:
                continue
            module = load_method(method)
            config = method_config(module, options, ev.seed)
            if label == REFERENCE:
                exact = exact or load_verifier("exact", policy, world_rows=world_rows)
                cell_verifier, verifier_name = exact, "exact"
            else:
                cell_verifier = None if method in NEEDS_NO_VERIFIER else verifier
                verifier_name = None if cell_verifier is None else methods_verifier_spec(cfg, arts, ref=True)
            cell_dir = out / "eval" / policy_name / label
            key = {"policy": arts[policy_name].ref, "verifier": verifier_name, "method": method,
                   "config": dataclasses.asdict(config), "problems": fingerprint, "backend": ev.backend,
                   "backend_options": ev.backend_options, "batch_size": ev.batch_size, "chunk_size": ev.chunk_size}
            overwrite = False
            key_path = cell_dir / CELL_KEY
            if key_path.exists():
                try:
                    stored = json.loads(key_path.read_text())
                except json.JSONDecodeError:
                    stored = None
                if stored != json.loads(json.dumps(key, default=str)):
                    log(f"{policy_name}/{label}: the settings changed since {cell_dir} was written; starting it afresh")
                    overwrite = True
            elif (cell_dir / "results.jsonl").exists():
                overwrite = True
            cell_dir.mkdir(parents=True, exist_ok=True)
            key_path.write_text(json.dumps(key, indent=2, default=str) + "\n")
            run_info = {"dataset": ev.dataset, "policy": policy, "policy_name": policy_name, "verifier": verifier_name,
                        "backend": ev.backend, "batch_size": ev.batch_size, "n_problems": ev.n_problems}
            if ev.dataset.startswith("world"):
                run_info["world_seed"] = ev.world_seed
            done = 0 if overwrite else len({r.get("id") for r in read_results(cell_dir)} & ids)
            if done == len(problems) and (cell_dir / "summary.json").exists():
                log(f"{policy_name}/{label}: complete in {cell_dir}, reused")
            else:
                log(f"{policy_name}/{label}: evaluating {len(problems) - done} of {len(problems)} problems")
            summary = evaluate(method, problems, generator, cell_verifier, config, cell_dir, chunk_size=ev.chunk_size,
                               run_info=run_info, verifier_is_reference=label == REFERENCE, overwrite=overwrite,
                               quiet=False, bootstrap_samples=ev.bootstrap_samples)
            log(f"{policy_name}/{label}: accuracy {summary['accuracy']:.3f} {summary['accuracy_ci95']}, "
                f"{summary['tokens_per_problem']:.0f} tokens/problem, {summary['method_seconds']:.1f}s")
    finally:
        for obj in (generator, verifier):
            obj.close()


# ----------------------------------------------------------------------------------------------
# analysis: cells, paired effects, StepCo's answer changes, accuracy-vs-tokens curves


def _correct(pred: str | None, problem) -> bool:
    from reasoning.grading import is_correct

    return pred is not None and is_correct(pred, problem.answer, problem.answer_kind, problem.options)


def cell_record(summary: dict[str, Any]) -> dict[str, Any]:
    n = summary["n"] or 1
    gen = summary["generator_prompt_tokens"] + summary["generator_completion_tokens"]
    return {
        "n": summary["n"], "correct": summary["correct"], "accuracy": summary["accuracy"],
        "accuracy_ci95": summary["accuracy_ci95"],
        "generator_prompt_tokens": summary["generator_prompt_tokens"],
        "generator_completion_tokens": summary["generator_completion_tokens"],
        "generator_tokens": gen, "verifier_tokens": summary["verifier_tokens"], "total_tokens": summary["total_tokens"],
        "tokens_per_problem": summary["total_tokens"] / n, "generator_tokens_per_problem": gen / n,
        "verifier_tokens_per_problem": summary["verifier_tokens"] / n,
        "llm_calls": summary["llm_calls"], "llm_calls_per_problem": summary["llm_calls"] / n,
        "verifier_calls": summary["verifier_calls"], "wall_seconds": summary["wall_seconds"],
        "method_seconds": summary["method_seconds"], "load_seconds": summary["load_seconds"],
        "no_prediction": summary["no_prediction"], "verifier_is_reference": summary.get("verifier_is_reference", False),
        "verifier": summary.get("verifier"),
    }


def _share(total: int, part: float, whole: float, k: int, n: int) -> float:
    """`total` scaled by part / whole (or k / n when whole is 0)."""
    return total * (part / whole if whole > 0 else k / max(n, 1))


def _layout_chars(question: str, text: str) -> int:
    from reasoning.steps import split_steps
    from reward_models.verifier import layout

    steps = split_steps(text).steps
    if not steps:
        return 0
    try:
        return len(layout(question, steps).text)
    except Exception:  # noqa: BLE001 - a path the verifier would refuse: it was not scored
        return 0


def sample_curve(rows: list[dict], method: str, ns: Sequence[int], problems: dict[str, Any]) -> list[dict[str, Any]]:
    """Self-consistency or Best-of-N at each N of `ns` from one run at a larger N: the first N
    samples of every problem, voted or ranked as the method does. Tokens: prompt tokens exact (the
    same prompt per sample); completion and verifier tokens split over samples in proportion to
    their characters (the verifier's attribution rule of `Tracker.score`)."""
    from inference.methods.base import majority_vote

    points = []
    for k in ns:
        correct, prompt, completion, vtok, usable = 0, 0.0, 0.0, 0.0, 0
        for row in rows:
            trace, usage, problem = row.get("trace") or {}, row.get("usage") or {}, problems[row["id"]]
            if method == "self_consistency":
                texts, answers = list(trace.get("samples") or []), list(trace.get("answers") or [])
                scores: list[float | None] = [None] * len(texts)
            else:
                samples = trace.get("samples") or []
                texts = [s.get("text", "") for s in samples]
                answers = [s.get("answer") for s in samples]
                scores = [s.get("score") for s in samples]
            n = len(texts)
            if k > n or n == 0:
                break
            usable += 1
            if method == "self_consistency":
                winner, _ = majority_vote(answers[:k], problem.answer_kind)
            else:
                best = None
                for j in range(k):
                    if scores[j] is not None and (best is None or scores[j] > scores[best]):
                        best = j
                winner = best if best is not None else majority_vote(answers[:k], problem.answer_kind)[0]
            pred = answers[winner] if winner is not None else None
            correct += _correct(pred, problem)
            prompt += usage.get("prompt_tokens", 0) * k / n
            chars = [len(t) for t in texts]
            completion += _share(usage.get("completion_tokens", 0), sum(chars[:k]), sum(chars), k, n)
            if usage.get("verifier_tokens", 0):
                v = [_layout_chars(row["question"], t) if scores[j] is not None else 0 for j, t in enumerate(texts)]
                vtok += _share(usage["verifier_tokens"], sum(v[:k]), sum(v), k, n)
        if usable != len(rows) or not rows:
            continue
        m = len(rows)
        points.append({"n": k, "accuracy": correct / m, "generator_tokens_per_problem": (prompt + completion) / m,
                       "verifier_tokens_per_problem": vtok / m, "tokens_per_problem": (prompt + completion + vtok) / m,
                       "llm_calls_per_problem": float(k)})
    return points


def _round_answer(rounds: list[dict], t: int, row: dict, kind: str) -> str | None:
    """The answer StepCo would give with T = t: the path after round t (the run's own prediction
    when round t is its last path)."""
    from reasoning.answers import extract_answer
    from reasoning.steps import join_steps

    if t >= len(rounds) - 1:
        return row.get("prediction")
    steps = rounds[t].get("steps") or []
    return extract_answer(join_steps(steps), kind) if steps else None


def _round_chars(question: str, rounds: list[dict], revision: str) -> list[tuple[int, int, int]]:
    """Per round: characters of its generator prompt, its completion and the path it verified."""
    from reasoning.prompts import revise_prompt, solve_prompt
    from reasoning.steps import join_steps

    out = []
    for r, entry in enumerate(rounds):
        steps = entry.get("steps") or []
        if r == 0:
            prompt, completion = len(solve_prompt(question)), len(join_steps(steps)) if steps else 0
        else:
            prev = rounds[r - 1]
            k = entry.get("revised_index") or 1
            prev_steps = prev.get("steps") or []
            try:
                if revision == "prompt":
                    p = (prev.get("scores") or [0.0] * len(prev_steps))[k - 1] if prev_steps else 0.0
                    prompt = len(revise_prompt(question, prev_steps, k, float(p)))
                else:
                    prompt = len(solve_prompt(question, prev_steps[: k - 1]))
            except (ValueError, IndexError, TypeError):
                prompt = len(solve_prompt(question))
            completion = len(join_steps(steps[k - 1:])) if steps[k - 1:] else 0
        verified = entry.get("scores") is not None and not entry.get("unusable")
        vchars = _layout_chars(question, join_steps(steps)) if verified and steps else 0
        out.append((prompt, completion, vchars))
    return out


def stepco_curve(rows: list[dict], max_rounds: int, problems: dict[str, Any]) -> list[dict[str, Any]]:
    """StepCo at T = 1..max_rounds from one T = max_rounds run: the answer after round t; tokens up
    to round t are the run's exact per-problem totals split over rounds in proportion to the
    characters of each round's (reconstructed) prompt, completion and verified path."""
    points = []
    for t in range(1, max_rounds + 1):
        correct, gen, ver, calls = 0, 0.0, 0.0, 0
        for row in rows:
            trace, usage, problem = row.get("trace") or {}, row.get("usage") or {}, problems[row["id"]]
            rounds = trace.get("rounds") or []
            if not rounds:
                continue
            correct += _correct(_round_answer(rounds, t, row, problem.answer_kind), problem)
            chars = _round_chars(row["question"], rounds, trace.get("revision", "prompt"))
            upto = chars[: t + 1]
            gen += _share(usage.get("prompt_tokens", 0), sum(c[0] for c in upto), sum(c[0] for c in chars), len(upto),
                          len(chars))
            gen += _share(usage.get("completion_tokens", 0), sum(c[1] for c in upto), sum(c[1] for c in chars),
                          len(upto), len(chars))
            ver += _share(usage.get("verifier_tokens", 0), sum(c[2] for c in upto), sum(c[2] for c in chars),
                          len(upto), len(chars))
            calls += len(upto)
        m = len(rows) or 1
        points.append({"t": t, "accuracy": correct / m, "generator_tokens_per_problem": gen / m,
                       "verifier_tokens_per_problem": ver / m, "tokens_per_problem": (gen + ver) / m,
                       "llm_calls_per_problem": calls / m})
    return points


def answer_changes(rows: list[dict], problems: dict[str, Any]) -> dict[str, Any]:
    """StepCo's Figure 4: correctness of the initial path (round 0) against the final answer."""
    counts = {"correct_to_correct": 0, "incorrect_to_correct": 0, "correct_to_incorrect": 0,
              "incorrect_to_incorrect": 0}
    revised = 0
    for row in rows:
        problem = problems[row["id"]]
        rounds = (row.get("trace") or {}).get("rounds") or []
        initial = _correct(_round_answer(rounds, 0, row, problem.answer_kind), problem) if rounds else False
        final = bool(row.get("correct"))
        revised += bool((row.get("trace") or {}).get("revisions"))
        counts[f"{'correct' if initial else 'incorrect'}_to_{'correct' if final else 'incorrect'}"] += 1
    return {**counts, "n": len(rows), "revised": revised,
            "net_gain": counts["incorrect_to_correct"] - counts["correct_to_incorrect"]}


def paired(rows_a: list[dict], rows_b: list[dict], resamples: int, seed: int) -> dict[str, Any] | None:
    """Accuracy of b minus a on the problems both answered, with a paired bootstrap interval."""
    from reasoning.stats import paired_bootstrap_diff

    by_id = {r["id"]: r for r in rows_b}
    ids = [r["id"] for r in rows_a if r["id"] in by_id]
    if not ids:
        return None
    a = {r["id"]: float(bool(r["correct"])) for r in rows_a}
    d = paired_bootstrap_diff([a[i] for i in ids], [float(bool(by_id[i]["correct"])) for i in ids],
                              resamples=resamples, seed=seed)
    return {"diff": d["diff"], "ci95": [d["ci_low"], d["ci_high"]], "n": d["n"]}


def effects(cfg: CompareConfig, results: dict[str, dict[str, list[dict]]]) -> dict[str, Any]:
    """The paired comparisons the question asks for.

    `headline`: each PPO policy alone (greedy, against the first policy), StepCo on each policy
    (against its greedy), each PPO policy and StepCo together (against the first policy's greedy),
    and the second PPO policy against the first (greedy). `by_method`: every other policy against
    the first under every method, and the two PPO policies against each other.
    """
    base = cfg.policies[0]
    revise = "stepco" if "stepco" in cfg.eval.methods else None
    plain = "greedy" if "greedy" in cfg.eval.methods else next(iter(cfg.eval.methods))

    def diff(a: tuple[str, str], b: tuple[str, str]) -> dict[str, Any] | None:
        ra, rb = results.get(a[0], {}).get(a[1]), results.get(b[0], {}).get(b[1])
        if not (ra and rb):
            return None
        d = paired(ra, rb, cfg.eval.bootstrap_samples, cfg.eval.seed)
        return d and {"from": f"{a[0]}/{a[1]}", "to": f"{b[0]}/{b[1]}", **d}

    headline = []

    def add(what: str, a: tuple[str, str], b: tuple[str, str]) -> None:
        d = diff(a, b)
        if d:
            headline.append({"effect": what, **d})

    others = [p for p in cfg.policies if p != base]
    mname = METHOD_NAMES.get(plain, plain)
    for p in others:
        add(f"{_pname(p)} alone ({mname})", (base, plain), (p, plain))
    if revise:
        for p in cfg.policies:
            add(f"StepCo alone, on {_pname(p)}", (p, plain), (p, revise))
        for p in others:
            add(f"{_pname(p)} and StepCo together", (base, plain), (p, revise))
    if len(others) >= 2:
        add(f"{_pname(others[1])} vs {_pname(others[0])} ({mname})", (others[0], plain), (others[1], plain))
    by_method: dict[str, dict[str, Any]] = {}
    pairs = [(base, p) for p in others] + ([(others[0], others[1])] if len(others) >= 2 else [])
    for a, b in pairs:
        row = {m: diff((a, m), (b, m)) for m in cfg.eval.methods}
        by_method[f"{b} vs {a}"] = {m: d for m, d in row.items() if d}
    return {"headline": headline, "by_method": by_method}


def _pname(p: str) -> str:
    return POLICY_NAMES.get(p, p)


# ----------------------------------------------------------------------------------------------
# report


def _fmt_ci(ci: Sequence[float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "—"


def _int(x: float) -> str:
    return f"{int(round(x)):,}"


def plot(path: Path, cfg: CompareConfig, curves: dict[str, dict[str, Any]], table: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = {"self_consistency": "o", "best_of_n": "s", "stepco": "^", "beats": "*", "greedy": "x",
               REFERENCE: "v"}
    styles = {"self_consistency": "-", "best_of_n": "--", "stepco": "-.", REFERENCE: ":", "beats": "", "greedy": ""}
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for i, policy in enumerate(cfg.policies):
        color = colors[i % len(colors)]
        c = curves.get(policy, {})
        for method in ("self_consistency", "best_of_n"):
            pts = c.get(method) or []
            if pts:
                ax.plot([p["tokens_per_problem"] for p in pts], [p["accuracy"] for p in pts], marker=markers[method],
                        color=color, linestyle=styles[method], alpha=0.85)
                for p in pts:
                    ax.annotate(f"{p['n']}", (p["tokens_per_problem"], p["accuracy"]), fontsize=6, color=color,
                                textcoords="offset points", xytext=(3, 3))
        for method in ("stepco", REFERENCE):
            pts = c.get(method) or []
            if pts:
                ax.plot([p["tokens_per_problem"] for p in pts], [p["accuracy"] for p in pts], marker=markers[method],
                        color=color, linestyle=styles[method], alpha=0.85, markerfacecolor="none" if method == REFERENCE else color)
                for p in pts:
                    ax.annotate(f"T{p['t']}", (p["tokens_per_problem"], p["accuracy"]), fontsize=6, color=color,
                                textcoords="offset points", xytext=(3, -8))
        for method in ("beats", "greedy"):
            cell = table.get(policy, {}).get(method)
            if cell:
                ax.scatter([cell["tokens_per_problem"]], [cell["accuracy"]], marker=markers[method], color=color,
                           s=90 if method == "beats" else 40, zorder=3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors[i % len(colors)], lw=3, label=_pname(p)) for i, p in enumerate(cfg.policies)]
    names = {"self_consistency": "self-consistency (N)", "best_of_n": "Best-of-N (N)", "stepco": "StepCo (T rounds)",
             "beats": "BEATS", "greedy": "greedy", REFERENCE: "StepCo + exact checker (reference)"}
    shown = {m for pol in curves.values() for m, pts in pol.items() if pts} | {
        m for pol in table.values() for m in pol if m in ("beats", "greedy")}
    handles += [Line2D([], [], color="gray", marker=markers[m], linestyle=styles[m],
                       markerfacecolor="none" if m == REFERENCE else "gray", label=names[m])
                for m in names if m in shown]
    ax.legend(handles=handles, fontsize=7, loc="best")
    ys = [p["accuracy"] for pol in curves.values() for pts in pol.values() for p in pts] + [
        c["accuracy"] for pol in table.values() for c in pol.values()]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = max(0.05, (hi - lo) * 0.1)
    ax.set_ylim(max(-0.02, lo - pad), min(1.02, hi + pad))
    ax.set_xscale("log")
    ax.set_xlabel("tokens per problem (generator prompt + completion + verifier)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"Accuracy vs tokens on {cfg.eval.dataset} ({cfg.eval.n_problems} problems)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(path: Path, s: dict[str, Any], cfg: CompareConfig) -> None:
    ev = cfg.eval
    L: list[str] = []
    L.append("# Step-PPO × verify-then-revise: policies × inference methods\n")
    L.append(f"Dataset **{ev.dataset}**, **{s['n_problems']} problems** (fingerprint `{s['problems_fingerprint']}`), "
             f"backend `{ev.backend}`, verifier `{s['verifier']}`. Total wall time of this run "
             f"{s['total_wall_seconds']:.0f} s (" + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s"
                                                         for k, v in s["stage_seconds"].items()) + ").\n")
    L.append("**Budgets.** Every cell answers the same problems with the same seeds (method seed "
             f"{ev.seed}; chunk c of {ev.chunk_size} problems runs with a seed derived from (seed, c)). Tokens count "
             "generator prompt and completion tokens *and* verifier tokens (what the verifier read), per problem. "
             "No method sees a gold answer at inference: the harness blinds the problems (no answer, no gold "
             "steps, no world quantities) and grades afterwards. The one exception is the row labelled "
             "*reference*, whose verifier is the world's exact step checker: an upper bound on what verify-then-"
             "revise can do with a perfect verifier, not a method.\n")
    ppo = s.get("ppo_budget")
    if ppo:
        L.append(f"**PPO budget** (the same for every PPO policy): {ppo['num_updates']} updates × "
                 f"{ppo['prompts_per_update']} prompts × {ppo['samples_per_prompt']} samples = "
                 f"{ppo['responses']:,} sampled responses from {ppo['n_prompts']} training prompts ({ppo['dataset']}), "
                 f"response limit {ppo['max_new_tokens']} tokens, seed {ppo['seed']}; rewards from the same verifier.\n")
    cal = s.get("stepco_threshold")
    if cal and cal.get("fallback"):
        L.append(f"**StepCo's threshold** θ = {cal['threshold']} as configured: calibration on "
                 f"{cal['dev_paths']} world dev paths was not possible ({cal['fallback']}).\n")
    elif cal:
        L.append(f"**StepCo's threshold** θ = {cal['threshold']:.4f}, calibrated for earliest-error F1 "
                 f"({cal['dev_f1']:.3f}) on the SFT policy's greedy paths of {cal['dev_paths']} world *dev* problems "
                 "(not the test problems), labelled by the world's checker; the same θ for every policy "
                 f"(configured: {cal['configured_threshold']}).\n")
    L.append("## Artefacts\n")
    L.append("| artefact | status | directory | build time (s) | notes |")
    L.append("|---|---|---|---|---|")
    for name, a in s["artefacts"].items():
        notes = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in a.get("info", {}).items()
                          if k in ("greedy_accuracy", "paths", "updates", "reward", "train_seconds"))
        secs = a.get("seconds")
        L.append(f"| {name} | {a['status']} | `{a['spec']}` | {'' if secs is None else f'{secs:.0f}'} | {notes} |")
    L.append("")
    L.append("## Accuracy and cost\n")
    L.append("Accuracy with its 95% bootstrap interval; tokens and calls are totals over all problems (per "
             "problem in brackets); wall time is the method's own time (model loading excluded).\n")
    L.append("| policy | method | accuracy | 95% CI | generator tokens (prompt + completion) | verifier tokens | "
             "tokens / problem | LLM calls | wall s |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for policy in cfg.policies:
        for label, c in s["table"].get(policy, {}).items():
            mname = METHOD_NAMES.get(label, label)
            if label == REFERENCE:
                mname = f"*{mname}*"
            L.append(f"| {_pname(policy)} | {mname} | {c['accuracy']:.3f} | {_fmt_ci(c['accuracy_ci95'])} | "
                     f"{_int(c['generator_tokens'])} ({_int(c['generator_prompt_tokens'])} + "
                     f"{_int(c['generator_completion_tokens'])}) | {_int(c['verifier_tokens'])} | "
                     f"{c['tokens_per_problem']:.0f} | {_int(c['llm_calls'])} ({c['llm_calls_per_problem']:.1f}) | "
                     f"{c['method_seconds']:.1f} |")
    L.append("")
    eff = s["effects"]
    if eff["headline"]:
        L.append("## Effects (paired on the same problems)\n")
        L.append("Accuracy difference and its 95% paired bootstrap interval (problems resampled once, both "
                 "outcomes of each drawn problem kept); an interval that excludes 0 is a difference these problems "
                 "resolve.\n")
        L.append("| effect | from → to | Δ accuracy | 95% CI |")
        L.append("|---|---|---|---|")
        for e in eff["headline"]:
            L.append(f"| {e['effect']} | {e['from']} → {e['to']} | {e['diff']:+.3f} | "
                     f"[{e['ci95'][0]:+.3f}, {e['ci95'][1]:+.3f}] |")
        L.append("")
    if eff["by_method"]:
        methods = list(cfg.eval.methods)
        L.append("Policy against policy under each method (Δ accuracy [95% paired CI]):\n")
        L.append("| comparison | " + " | ".join(METHOD_NAMES.get(m, m) for m in methods) + " |")
        L.append("|---|" + "---|" * len(methods))
        for what, row in eff["by_method"].items():
            b, _, a = what.partition(" vs ")
            cells_ = [f"{row[m]['diff']:+.3f} [{row[m]['ci95'][0]:+.3f}, {row[m]['ci95'][1]:+.3f}]" if m in row else "—"
                      for m in methods]
            L.append(f"| {_pname(b)} vs {_pname(a)} | " + " | ".join(cells_) + " |")
        L.append("")
    if s["answer_changes"]:
        L.append("## StepCo's answer changes (its Figure 4)\n")
        L.append("Between the initial path (round 0 of StepCo's trace, the policy's greedy path) and StepCo's final "
                 "answer, graded against gold afterwards.\n")
        L.append("| policy | verifier | correct → correct | incorrect → correct | correct → incorrect | "
                 "incorrect → incorrect | revised | net |")
        L.append("|---|---|---|---|---|---|---|---|")
        for policy in cfg.policies:
            for label, a in s["answer_changes"].get(policy, {}).items():
                ver = ("exact checker (reference)" if label == REFERENCE else ev.verifier or
                       ("PSV" if cfg.psv.combine_with is None else f"PSV {cfg.psv.combine_rule} {cfg.psv.combine_with}"))
                L.append(f"| {_pname(policy)} | {ver} | {a['correct_to_correct']} | {a['incorrect_to_correct']} | "
                         f"{a['correct_to_incorrect']} | {a['incorrect_to_incorrect']} | {a['revised']} of {a['n']} | "
                         f"{a['net_gain']:+d} |")
        L.append("")
    L.append("## Accuracy against tokens\n")
    L.append("![accuracy vs tokens](accuracy_vs_tokens.png)\n")
    L.append("One colour per policy, one marker per method. Self-consistency and Best-of-N at N = "
             f"{', '.join(map(str, ev.curve_n))} come from **one run at N = max** per cell: the first N samples of "
             "each problem are voted (self-consistency) or ranked by the verifier (Best-of-N, majority vote when "
             "none of them could be scored) as the method does. Their tokens: prompt tokens exactly N/max of the "
             "run's (one prompt per sample); completion tokens and verifier tokens are the run's exact per-problem "
             "totals split over the samples in proportion to each sample's characters (per-sample token counts are "
             "not in the method traces; the verifier split is the harness's own attribution rule). StepCo at "
             "T = 1..max_rounds comes from **one run at T = max_rounds**: the answer after round t, and the run's "
             "exact per-problem token totals split over rounds in proportion to the characters of each round's "
             "reconstructed prompt, completion and verified path (per-round tokens are not in the trace). At "
             "N = max and T = max_rounds the points are the measured totals. BEATS and greedy are single points.\n")
    L.append("| policy | method | points (N or T: accuracy @ tokens/problem) |")
    L.append("|---|---|---|")
    for policy in cfg.policies:
        for method, pts in s["curves"].get(policy, {}).items():
            k = "n" if method in ("self_consistency", "best_of_n") else "t"
            text = "; ".join(f"{'N' if k == 'n' else 'T'}={p[k]}: {p['accuracy']:.3f} @ {p['tokens_per_problem']:.0f}"
                             for p in pts)
            L.append(f"| {_pname(policy)} | {METHOD_NAMES.get(method, method)} | {text} |")
    L.append("")
    L.append("## Reproduce\n")
    L.append(f"```\n{s['command']}\n```\n")
    L.append(f"The resolved config is `{RESOLVED}`; every cell's rows are in `eval/<policy>/<method>/results.jsonl`.\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(L))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# the run


def calibrate_stepco_threshold(cfg: CompareConfig, arts: dict[str, Artefact], out: Path) -> dict[str, Any] | None:
    """θ for StepCo from world dev paths (see EvalSection.threshold_dev_problems); cached in
    DIR/stepco_threshold.json under what it depends on. None when not asked for or no StepCo."""
    ev = cfg.eval
    if ev.threshold_dev_problems is None or "stepco" not in ev.methods:
        return None
    from inference.backends.base import SamplingParams
    from inference.evaluate import build_generator
    from reasoning.world import generate, world_config_of
    from reward_models.evaluate import (
        calibrate_threshold,
        earliest_error_predictions,
        processbench_metrics,
        sample_world_paths,
        score_items,
        step_metric_inputs,
    )
    from reward_models.load import load_verifier

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
    scores, _ = score_items(verifier, items, ev.verifier_batch_size)
    s, g, _ = step_metric_inputs(items, scores)
    configured = float(ev.methods["stepco"].get("threshold", 0.5))
    fallback = None
    try:
        threshold = calibrate_threshold(s, g)
    except ValueError as e:  # e.g. no correct dev path: F1 is undefined, keep the configured θ
        threshold, fallback = configured, str(e)
    metrics = processbench_metrics(earliest_error_predictions(s, threshold), g) if s else {
        "f1": 0.0, "acc_erroneous": 0.0, "acc_correct": 0.0}
    info = {"key": key, "threshold": threshold, "dev_paths": len(s), "dev_f1": metrics["f1"],
            "dev_acc_erroneous": metrics["acc_erroneous"], "dev_acc_correct": metrics["acc_correct"],
            "configured_threshold": configured, "fallback": fallback, "seconds": round(time.time() - start, 1)}
    path.write_text(json.dumps(info, indent=2) + "\n")
    if fallback:
        log(f"warning: stepco threshold not calibrated ({fallback}); using the configured {configured}")
    else:
        log(f"stepco threshold: {threshold:.4f} (dev F1 {metrics['f1']:.3f} on {len(s)} greedy dev paths) in "
            f"{info['seconds']:.0f}s")
    return info


def _read_cell(out: Path, policy: str, label: str) -> tuple[dict | None, list[dict]]:
    from inference.evaluate import read_results

    cell = out / "eval" / policy / label
    try:
        summary = json.loads((cell / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None, []
    return summary, read_results(cell)


def run(cfg: CompareConfig, out: Path, command: str = "") -> dict[str, Any]:
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    log_dir = out / "logs"
    (out / RESOLVED).write_text(json.dumps(_plain(cfg), indent=2) + "\n")
    arts = artefacts(cfg)
    status: dict[str, str] = {}
    for art in arts.values():
        if art.given:
            if art.kind != "psv" and not Path(art.spec).exists() and cfg.eval.backend == "hf":
                raise CompareError(f"{art.name}.path {art.spec}: no such directory")
            status[art.name] = "given"
        else:
            status[art.name] = "reused" if art.complete() else "trained"
            if art.complete():
                log(f"{art.name}: reusing {art.dir}")
                if art.marker().get("code") != code_digest(art.kind):
                    status[art.name] = "reused (built with other code)"
                    log(f"warning: {art.name} in {art.dir} was built by other (or unrecorded) versions of "
                        f"{', '.join(CODE[art.kind])}; "
                        "delete it, or set rebuild_on_code_change: true, to build it again")

    # 1. SFT and PSV, one after the other (everything else depends on them)
    t0 = time.time()
    sft, psv = arts["sft"], arts["psv"]
    from reasoning.threads import available_cores, torch_threads

    # the SFT and PSV stages run alone: every core (this process keeps one thread otherwise)
    with torch_threads(available_cores()) as cores:
        log(f"sft and psv: {cores} torch threads")
        if not sft.complete():
            build_sft(cfg, sft, log_dir)
        if not psv.complete():
            build_psv(cfg, psv, sft.spec)
        calibration = calibrate_stepco_threshold(cfg, arts, out)
    if calibration is not None:
        cfg.eval.methods["stepco"]["threshold"] = calibration["threshold"]
        (out / RESOLVED).write_text(json.dumps(_plain(cfg), indent=2) + "\n")  # what the stages read

    # 2. PPO runs (side by side with workers > 1), then 3. the evaluation of every policy
    jobs: list[Job] = []
    for name in cfg.policies:
        art = arts[name]
        if name == "sft" or art.complete():
            continue
        log(f"{name}: to train (PPO, reward {cfg.ppo.runs[name].reward}) into {art.dir}")
        jobs.append(Job(name=f"ppo_{name}", inline=lambda n=name: build_ppo_inline(cfg, n, arts, log_dir),
                        command=ppo_command(cfg, name, arts), finish=lambda a=art: finish_ppo(a)))
    train_jobs = [j.name for j in jobs]
    groups = eval_groups(cfg, cfg.eval.dataset.startswith("world"), cfg.workers)
    for name in cfg.policies:
        dep = [f"ppo_{name}"] if f"ppo_{name}" in train_jobs else []
        for k, group in enumerate(groups):
            stage = f"eval:{name}" + (f":{'+'.join(group)}" if len(groups) > 1 else "")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--resolved",
                   str(out / RESOLVED), "--out", str(out)]
            job_name = f"eval_{name}" + (f"_{k + 1}" if len(groups) > 1 else "")
            jobs.append(Job(name=job_name, inline=lambda n=name, g=group: evaluate_policy(cfg, n, out, g),
                            command=cmd, after=dep))
    train_seconds = time.time() - t0
    t1 = time.time()
    run_jobs(jobs, cfg.workers, log_dir)
    jobs_seconds = time.time() - t1

    # 4. collect, analyse, report
    from inference.evaluate import load_method

    t2 = time.time()
    problems_list, world_rows = load_eval_problems(cfg.eval, sft.spec)
    problems = {p.id: p for p in problems_list}
    table: dict[str, dict[str, Any]] = {}
    results: dict[str, dict[str, list[dict]]] = {}
    curves: dict[str, dict[str, Any]] = {}
    changes: dict[str, dict[str, Any]] = {}
    fingerprint = None
    for policy in cfg.policies:
        for label, method, options in cells(cfg, bool(world_rows)):
            summary, rows = _read_cell(out, policy, label)
            if summary is None or not summary.get("complete"):
                raise CompareError(f"{out / 'eval' / policy / label}: no complete evaluation")
            fingerprint = fingerprint or summary.get("problems_fingerprint")
            if summary.get("problems_fingerprint") != fingerprint:
                raise CompareError(f"{policy}/{label}: evaluated on other problems than the other cells")
            table.setdefault(policy, {})[label] = cell_record(summary)
            results.setdefault(policy, {})[label] = rows
            mcfg = method_config(load_method(method), options, cfg.eval.seed)
            if method in ("self_consistency", "best_of_n"):
                ns = sorted({n for n in cfg.eval.curve_n if n <= mcfg.n})
                curves.setdefault(policy, {})[label] = sample_curve(rows, method, ns, problems)
            elif method == "stepco":
                curves.setdefault(policy, {})[label] = stepco_curve(rows, mcfg.max_rounds, problems)
                changes.setdefault(policy, {})[label] = answer_changes(rows, problems)
    effect_rows = effects(cfg, results)
    artefact_info = {}
    for name, art in arts.items():
        if name not in ("sft", "psv") and name not in cfg.policies:
            continue
        marker = art.marker() if not art.given else {}
        info = {k: v for k, v in marker.items() if k not in ("key", "kind", "name", "hash", "finished", "seconds")}
        if art.kind == "ppo" and name in cfg.ppo.runs:
            info["reward"] = cfg.ppo.runs[name].reward
        artefact_info[name] = {"status": status[name], "spec": art.spec, "dir": str(art.dir),
                               "hash": None if art.given else art.hash, "seconds": marker.get("seconds"), "info": info}
    ppo_budget = None
    if any(a.kind == "ppo" and not a.given for a in arts.values()):
        a = cfg.ppo.args
        ppo_budget = {k: a.get(k) for k in BUDGET_KEYS}
        from rl.ppo_config import StepPPOConfig

        defaults = {f.name: f.default for f in dataclasses.fields(StepPPOConfig)}
        ppo_budget = {k: (v if v is not None else defaults.get(k)) for k, v in ppo_budget.items()}
        ppo_budget["responses"] = ppo_budget["num_updates"] * ppo_budget["prompts_per_update"] * ppo_budget[
            "samples_per_prompt"]
    report_seconds = time.time() - t2
    summary = {
        "dataset": cfg.eval.dataset, "n_problems": len(problems_list), "problems_fingerprint": fingerprint,
        "policies": cfg.policies, "methods": list(cfg.eval.methods),
        "reference": REFERENCE if cfg.eval.reference_exact and world_rows and "stepco" in cfg.eval.methods else None,
        "verifier": methods_verifier_spec(cfg, arts), "seed": cfg.eval.seed,
        "stepco_threshold": calibration,
        "budgets": {"same_problems_every_cell": True, "same_seeds_every_cell": True, "verifier_tokens_counted": True,
                    "gold_at_inference": False},
        "ppo_budget": ppo_budget,
        "artefacts": artefact_info,
        "table": table, "effects": effect_rows, "answer_changes": changes, "curves": curves,
        "token_approximations": {
            "sample_curves": "prompt tokens exact (k/N); completion and verifier tokens split by characters",
            "stepco_curve": "per-round tokens split by characters of reconstructed prompts, completions and paths",
        },
        "stage_seconds": {"sft_psv_and_calibration": round(train_seconds, 1), "ppo_and_evaluation": round(jobs_seconds, 1),
                          "report": round(report_seconds, 1)},
        "total_wall_seconds": 0.0,
        "command": command, "config": _plain(cfg),
    }
    plot(out / "accuracy_vs_tokens.png", cfg, curves, table)
    summary["total_wall_seconds"] = round(time.time() - start, 1)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "summary.json")
    write_report(out / "report.md", summary, cfg)
    log(f"done in {summary['total_wall_seconds']:.0f}s: {out / 'report.md'}, {out / 'summary.json'}, "
        f"{out / 'accuracy_vs_tokens.png'}")
    return summary


def plan(cfg: CompareConfig) -> dict[str, Any]:
    """What a run would do: every artefact (directory, reused or to build) and every cell."""
    arts = artefacts(cfg)
    world = cfg.eval.dataset.startswith("world")
    return {
        "artefacts": {name: {"spec": a.spec, "status": "given" if a.given else "reuse" if a.complete() else "build",
                             "hash": None if a.given else a.hash} for name, a in arts.items()},
        "policies": cfg.policies,
        "cells": [label for label, _, _ in cells(cfg, world)],
        "problems": {"dataset": cfg.eval.dataset, "n": cfg.eval.n_problems},
        "workers": cfg.workers,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help=f"YAML recipe (default: the embedded default, {DEFAULT_CONFIG.relative_to(ROOT)})")
    p.add_argument("--out", required=True, help="Output directory (report.md, summary.json, the PNG, eval/, logs/)")
    p.add_argument("--quick", action="store_true", help=f"Merge {QUICK_CONFIG.relative_to(ROOT)} over the config (smoke run)")
    p.add_argument("--n_problems", type=int, default=None, help="Override eval.n_problems")
    p.add_argument("--cache_dir", default=None, help="Override cache_dir")
    p.add_argument("--workers", type=int, default=None, help="Override workers")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="Override any config entry, e.g. --set eval.methods.stepco.threshold=0.6 (repeatable)")
    p.add_argument("--dry_run", action="store_true",
                   help="Print the plan (artefacts with their cache directories and status, cells) and exit")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)  # eval:<policy>[:<label>+...], subprocesses
    p.add_argument("--resolved", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.stage:
            if not args.stage.startswith("eval:") or not args.resolved:
                raise CompareError(f"--stage {args.stage}: expected eval:<policy> with --resolved")
            cfg = _build(CompareConfig, json.loads(Path(args.resolved).read_text()), "")
            _, name, *group = args.stage.split(":", 2)
            evaluate_policy(cfg, name, Path(args.out), group[0].split("+") if group else None)
            return 0
        overrides: dict[str, Any] = {}
        if args.n_problems is not None:
            overrides.setdefault("eval", {})["n_problems"] = args.n_problems
        if args.cache_dir is not None:
            overrides["cache_dir"] = args.cache_dir
        if args.workers is not None:
            overrides["workers"] = args.workers
        cfg = load_config(args.config, args.quick, args.sets, overrides)
        if args.dry_run:
            print(json.dumps(plan(cfg), indent=2))
            return 0
        command = shlex.join(["python", "scripts/compare.py", *(argv if argv is not None else sys.argv[1:])])
        run(cfg, Path(args.out), command)
    except CompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
