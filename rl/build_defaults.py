"""The models of the no-argument CPU run, built when a PPO run names them and they are absent
(`--build_missing`, on by default): the tiny SFT policy (`rl.sft`'s embedded default), the verifier
LM of the default verifier (the same recipe taught by the clean teacher, in the policy's world) and
the tiny PSV from StepCo-tree labels. `rl/ppo_step.py` calls `ensure_default_models` before it loads
anything; their paths are rl/ppo_config.py's defaults.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from reasoning.world import WorldConfig, world_config_of
from rl.ppo_config import DEFAULT_POLICY, DEFAULT_VERIFIER, DEFAULT_VERIFIER_LM, TREE_PSV, StepPPOConfig
from rl.ppo_setup import log
from rl.rewards import REWARDS


def _train_sft(argv: list[str], what: str, path: str) -> None:
    """`rl.sft` into PATH.building, renamed to PATH once it has finished: a build that is killed or
    fails leaves no PATH that a later run would take for a finished model (it would not load, or
    load half-trained); the next run starts that build again."""
    import torch

    from reasoning.threads import torch_threads
    from rl import sft  # TRL's SFT stack: loaded only when a model is built

    building = Path(f"{path}.building")
    if building.exists():
        log(f"{building} is an unfinished build (a run stopped during it): starting it again")
        shutil.rmtree(building)
    with torch_threads(torch.get_num_threads()):  # rl.sft.main would drop to one thread otherwise
        code = sft.main(["--output_dir", str(building), *argv])
    if code:
        raise RuntimeError(f"building {what} failed with exit code {code}")
    building.rename(path)


def build_default_policy(path: str = DEFAULT_POLICY, seed: int = 0) -> None:
    """The tiny SFT policy of `python -m rl.sft` with its embedded defaults and training seed `seed`
    (~8 min on 2 cores)."""
    argv = ["--seed", str(seed)]
    log(f"no policy at {path}: training the tiny SFT policy first (python -m rl.sft --output_dir {path} "
        f"{' '.join(argv)})")
    _train_sft(argv, "the default policy", path)


def verifier_lm_world_flags(policy: str) -> list[str]:
    """`rl.sft` flags that give a verifier LM the policy's world (`world_config.json`), so that it
    is taught the problems the policy is trained and evaluated on."""
    world = world_config_of(policy)
    if tuple(world.ops) != tuple(WorldConfig().ops):
        log(f"the policy's world uses the step kinds {','.join(world.ops)}; rl.sft has no flag for them, so "
            "the verifier LM is taught the default kinds")
    return [arg for key, value in world.__dict__.items() if key != "ops"
            for arg in (f"--world_{key}", str(value))]


def build_default_verifier_lm(policy: str, path: str = DEFAULT_VERIFIER_LM) -> None:
    """The verifier LM of the default verifier: `python -m rl.sft --teacher_noise none` in the
    policy's world (~6 min on 2 cores). It has seen the clean teacher's demonstrations, never a
    step label; its step likelihood is the step reward."""
    argv = ["--teacher_noise", "none", *verifier_lm_world_flags(policy)]
    log(f"no verifier LM at {path}: training it first (python -m rl.sft --output_dir {path} {' '.join(argv)})")
    start = time.time()
    _train_sft(argv, "the default verifier LM", path)
    log(f"verifier LM ready in {time.time() - start:.0f}s")


def build_default_verifier(policy: str, path: str = TREE_PSV, n_problems: int = 300,
                           epochs: float = 2.0) -> None:
    """A PSV from StepCo-tree annotation of the policy's own paths (the best F1 of the annotation
    methods on the world, docs/results/verifiers_world.md), trained from the policy's backbone
    (~2 min on 2 cores)."""
    from reward_models.annotate import AnnotateConfig, train_on_annotation

    start = time.time()
    log(f"no verifier at {path}: annotating {n_problems} world train problems with the StepCo tree")
    cfg = AnnotateConfig(method="tree", policy=policy, out=f"{path}.annotation.jsonl", n=n_problems, seed=1,
                         disable_tqdm=True)
    train_on_annotation(cfg, path, log=log, num_train_epochs=epochs)
    log(f"verifier ready in {time.time() - start:.0f}s")


def ensure_default_models(args: StepPPOConfig, is_main: bool) -> None:
    """Build, on the main process, each default model the run names that is absent."""
    if not args.build_missing or not is_main:
        return
    if args.model_name_or_path == DEFAULT_POLICY and not Path(args.model_name_or_path).exists():
        build_default_policy(args.model_name_or_path, args.sft_seed)
    if not REWARDS[args.reward].verifier:
        return
    if args.verifier == DEFAULT_VERIFIER:
        if not Path(DEFAULT_VERIFIER_LM).exists():
            build_default_verifier_lm(args.model_name_or_path, DEFAULT_VERIFIER_LM)
        elif world_config_of(DEFAULT_VERIFIER_LM) != world_config_of(args.model_name_or_path):
            log(f"the verifier LM at {DEFAULT_VERIFIER_LM} was taught another world than the policy's: "
                "move it away to have it rebuilt in the policy's world")
    if args.verifier == TREE_PSV and not Path(TREE_PSV).exists():
        build_default_verifier(args.model_name_or_path, TREE_PSV)
