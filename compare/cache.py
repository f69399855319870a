"""The artefact cache: what is trained and where it lives. Every artefact (the SFT policy, the
PSV, each PPO run) has a key (the config entries that define it and the refs of what it is built
from), a directory `<cache_dir>/<kind>-<hash of the key>/` and, once complete, a marker file; a
config `path` names an existing artefact used as it is."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare.config import ROOT, VERIFIER_LM, CompareConfig, names_verifier_lm, uses_verifier_lm
from reasoning.jsonl import atomic_write
from rl.rewards import REWARDS
from rl.run_dir import RunDir

CACHE_VERSION = 1
"""Part of every artefact hash: bump it when a change of this script changes what it trains."""
MARKER = "compare_artefact.json"


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Artefact:
    name: str
    """sft, verifier_lm, psv or a PPO run name."""
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
        return f"{self.kind}-{self.hash}" if not self.given else str(self.key.get("path", self.spec))

    @property
    def spec(self) -> str:
        """The policy directory or verifier spec that other stages load."""
        if self.given:
            return str(self.given_spec)
        return str({"sft": self.dir, "psv": self.dir / "verifier", "ppo": RunDir(self.dir).policy}[self.kind])

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
    "psv": ("reward_models/annotate", "reward_models/train.py", "reward_models/psv.py"),
    "ppo": ("rl/ppo_config.py", "rl/ppo_checks.py", "rl/ppo_setup.py", "rl/ppo_step.py", "rl/ppo_trainer.py",
            "rl/rollouts.py", "rl/batches.py", "rl/ppo_eval.py", "rl/ppo_math.py", "rl/step_rewards.py",
            "rl/reward_table.py", "rl/ppo_prepare.py", "rl/rewards.py", "rl/length_drift.py", "rl/online_prm.py"),
}
"""The source files that decide what each kind of artefact becomes (their defaults included); a
folder stands for its Python files."""


def code_digest(kind: str) -> str:
    h = hashlib.sha256()
    for entry in CODE[kind]:
        folder = ROOT / entry
        files = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder]
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            h.update(rel.encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>") + b"\0")
    return h.hexdigest()[:12]


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if Path(path).expanduser().exists() else path


def artefacts(cfg: CompareConfig) -> dict[str, Artefact]:
    """The SFT policy, the verifier LM (when a verifier spec names it), the PSV and every PPO run
    named in `policies`, with their cache directories."""
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
    if uses_verifier_lm(cfg):
        if cfg.verifier_lm.path:
            p = _abs(cfg.verifier_lm.path)
            out[VERIFIER_LM] = Artefact(VERIFIER_LM, "sft", {"path": p}, Path(p), True, p)
        else:
            key = {"kind": "sft", "version": CACHE_VERSION, "args": cfg.verifier_lm.args, "launcher": cfg.launcher}
            if cfg.rebuild_on_code_change:
                key["code"] = code_digest("sft")
            out[VERIFIER_LM] = Artefact(VERIFIER_LM, "sft", key, cache / f"sft-{digest(key)}", False)
    if cfg.psv.path:
        spec, ref = bind_verifier_lm(_abs(cfg.psv.path), out), bind_verifier_lm(_abs(cfg.psv.path), out, ref=True)
        psv = Artefact("psv", "psv", {"path": ref}, Path(spec), True, spec)
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
               "verifier": ppo_verifier_spec(cfg, name, out, ref=True), "launcher": cfg.launcher}
        if cfg.rebuild_on_code_change:
            key["code"] = code_digest("ppo")
        out[name] = Artefact(name, "ppo", key, cache / f"ppo-{run.reward.replace('+', '_')}-{digest(key)}", False)
    return out


def bind_verifier_lm(spec: str, arts: dict[str, Artefact], ref: bool = False) -> str:
    """`spec` with every `<prefix>:verifier_lm` part reading the verifier LM artefact (its directory,
    or with `ref` its cache ref, which is what keys hold)."""
    from reward_models.load import map_spec_parts, split_spec

    if not names_verifier_lm(spec):
        return spec
    lm = arts[VERIFIER_LM]
    target = lm.ref if ref else lm.spec

    def bind(part: str) -> str:
        head, rest = split_spec(part)
        return f"{head}:{target}" if rest == VERIFIER_LM else part

    return map_spec_parts(spec, bind)


def verifier_spec(cfg: CompareConfig, arts: dict[str, Artefact], ref: bool = False) -> str:
    """The verifier every stage loads: the PSV, joined with `psv.combine_with` when set; confidence
    specs are bound to the SFT policy, so every policy is judged by the same verifier. With `ref`,
    the same made of artefact refs (what cache keys and cell keys hold)."""
    from reward_models.load import pin_policy

    psv, sft = (arts["psv"].ref, arts["sft"].ref) if ref else (arts["psv"].spec, arts["sft"].spec)
    spec = psv if cfg.psv.combine_with is None else f"{cfg.psv.combine_rule}:{cfg.psv.combine_with},{psv}"
    return bind_verifier_lm(pin_policy(spec, sft), arts, ref)


def ppo_verifier_spec(cfg: CompareConfig, name: str, arts: dict[str, Artefact], ref: bool = False) -> str | None:
    """The verifier PPO run `name` reads, or None when its reward reads none (the answer check): such
    a run gets no --verifier and is not keyed by one, so a new verifier retrains only the runs it pays."""
    return verifier_spec(cfg, arts, ref) if REWARDS[cfg.ppo.runs[name].reward].verifier else None


def methods_verifier_spec(cfg: CompareConfig, arts: dict[str, Artefact], ref: bool = False) -> str:
    """The verifier of the methods: `eval.verifier` (bound to the SFT policy) when set, else
    `verifier_spec`."""
    from reward_models.load import pin_policy

    if cfg.eval.verifier:
        return bind_verifier_lm(pin_policy(cfg.eval.verifier, arts["sft"].ref if ref else arts["sft"].spec), arts, ref)
    return verifier_spec(cfg, arts, ref)


def write_marker(art: Artefact, seconds: float, extra: dict[str, Any] | None = None) -> None:
    info = {"kind": art.kind, "name": art.name, "hash": art.hash, "key": art.key, "code": code_digest(art.kind),
            "seconds": round(seconds, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), **(extra or {})}
    atomic_write(art.dir / MARKER, json.dumps(info, indent=2) + "\n")
