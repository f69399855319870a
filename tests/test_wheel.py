"""The toolkit as a user installs it: the wheel built from this checkout, installed into a fresh
virtual environment (no checkout on its path), answers `--help` and plans a comparison from the
recipes it ships. The dependencies come from the project's environment (a .pth line), so nothing
is downloaded; the wheel itself is installed with --no-deps."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "reasoning", "backends", "reward_models", "rl", "inference",
           "compare", "configs")


def _run(cmd, cwd, env, timeout=120):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
    return done


@pytest.mark.slow
def test_the_wheel_installs_and_its_commands_run_without_the_checkout(tmp_path):
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: the build writes build/ and *.egg-info beside the sources
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
          src], tmp_path, env)
    (wheel,) = (tmp_path / "dist").glob("steprl-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                     env).stdout.strip())
    # the project's dependencies by path; its .pth files (the checkout's editable install) are not read
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([python, "-m", "pip", "install", "--no-deps", "-q", wheel], tmp_path, env)

    where = _run([python, "-c", "import rl, compare, configs; print(rl.__file__, list(configs.__path__)[0])"],
                 tmp_path, env).stdout
    assert str(ROOT) not in where and str(site) in where, where
    bin_dir = venv / "bin"
    ppo = _run([bin_dir / "steprl-ppo", "--help"], tmp_path, env).stdout
    assert "--model_name_or_path" in ppo and "--dataset" in ppo
    assert "--dataset" in _run([bin_dir / "steprl-evaluate", "--help"], tmp_path, env).stdout
    plan = _run([bin_dir / "steprl-compare", "--dry_run", "--out", tmp_path / "cmp"], tmp_path, env).stdout
    assert '"artefacts"' in plan or '"cells"' in plan, plan[:500]
    recipe = site / "configs" / "ppo" / "gpu_qwen_math.yaml"
    assert recipe.is_file()
