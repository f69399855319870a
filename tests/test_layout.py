"""Package boundaries: every package imports from this repository, and imports go one way: the
floors are reasoning, then backends, then reward_models, then rl and inference side by side, then
compare; nothing imports a floor above its own."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reasoning", "backends", "reward_models", "rl", "inference", "compare")
# What each part of the toolkit may import from the others (DESIGN.md).
ALLOWED = {
    "reasoning": set(),
    "backends": {"reasoning"},
    "reward_models": {"reasoning", "backends"},
    "rl": {"reasoning", "reward_models", "backends"},
    "inference": {"reasoning", "backends", "reward_models"},
    # the end-to-end comparison is the top floor: it imports every package and nothing imports it
    "compare": {"reasoning", "backends", "reward_models", "rl", "inference"},
}


@pytest.mark.parametrize("name", PACKAGES)
def test_packages_import_from_this_repository(name):
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve().is_relative_to(ROOT), (
        f"{name} imports from {module.__file__}: install the toolkit in its own virtual environment"
    )


def _part(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def _imported_parts(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    out = set()
    for name in names:
        top = name.split(".")[0]
        if top not in PACKAGES:
            continue
        out.add(top)
    return out


def test_imports_go_one_way():
    bad = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            part = _part(path)
            used = _imported_parts(ast.parse(path.read_text())) - {part}
            illegal = used - ALLOWED[part]
            if illegal:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(illegal)}")
    assert not bad, "\n".join(bad)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The repository modules that `path` imports anywhere in it (inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        out.update(name for name in names if name in modules)
    return out


CIRCLE_FREE = ("reasoning", "backends", "inference", "reward_models", "rl", "compare")
"""Packages none of whose modules is on an import circle: all of them."""


def test_no_module_imports_itself_back():
    """No file imports, directly or through others, a file that imports it back (DESIGN.md), even
    from inside a function: such a circle only works while the late import stays late."""
    paths = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = {name: _module_imports(path, set(paths)) - {name} for name, path in paths.items()}
    circles = []
    for start in sorted(name for name in graph if name.split(".")[0] in CIRCLE_FREE):
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                circles.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])
    assert not circles, f"modules on an import circle: {', '.join(circles)}"


def _imported_top_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_toolkit_never_imports_the_lab_or_the_scripts():
    """`experiments/` (studies of the world) and `scripts/` (entry points) sit on top of the toolkit:
    a toolkit module that imported them would break in an installed wheel, which ships neither."""
    bad = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            used = _imported_top_names(ast.parse(path.read_text())) & {"experiments", "scripts"}
            if used:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(used)}")
    assert not bad, "\n".join(bad)


def test_scripts_holds_entry_points_only():
    """`scripts/` holds what a user runs (set-up and tests, the comparison, the PPO reports, the GPU
    checks); a lab script (a study, a benchmark) goes to `experiments/`, run as `python -m
    experiments.NAME`."""
    entry_points = {"setup_env.sh", "check_fresh_install.sh", "readme_walkthrough.py", "test.sh", "compare.py",
                    "ppo_report.py", "rl_comparison.py", "gpu_smoke.sh", "gpu_smoke_vllm.py", "gpu_smoke_zero3.py"}
    assert {p.name for p in (ROOT / "scripts").iterdir() if p.is_file()} == entry_points


def test_the_wheel_ships_the_toolkit_only():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    setuptools = pytest.importorskip("setuptools")
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = setuptools.find_packages(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert {name.split(".")[0] for name in shipped} == set(PACKAGES)
    assert (ROOT / "experiments" / "__init__.py").exists()


def test_ppo_setup_loads_and_rl_build_defaults_builds():
    """Loading a run's models (rl/ppo_setup.py) and building the no-argument run's missing ones
    (rl/build_defaults.py, which rl/ppo_step.py calls) are two modules: the loader trains nothing."""
    builders = {"rl.sft", "reward_models.annotate", "reward_models.train"}

    def imported(path: Path) -> set[str]:  # `from rl import sft` imports rl and rl.sft
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        return names

    assert not imported(ROOT / "rl" / "ppo_setup.py") & builders
    assert imported(ROOT / "rl" / "build_defaults.py") & builders
    assert "rl.build_defaults" in imported(ROOT / "rl" / "ppo_step.py")


@pytest.mark.parametrize(("registry", "home", "offered"), [
    ("rl.ppo_math:ESTIMATORS", "ppo_math.py", "rl.ppo_config:ADVANTAGE_ESTIMATORS"),
    ("rl.rewards:REWARDS", "rewards.py", "rl.ppo_config:REWARD_MODES"),
])
def test_each_choice_by_name_is_resolved_in_one_registry(registry, home, offered):
    """An advantage estimator's and a reward's name is looked up in its registry (what the update
    does around it); the config offers exactly its names, and no other rl module tests a name."""
    def attr(spec):
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)

    names = set(attr(registry))
    assert tuple(attr(registry)) == attr(offered)
    bad = []
    for path in (ROOT / "rl").glob("*.py"):
        if path.name == home:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                tested = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)} & names
                if tested:
                    bad.append(f"{path.name}:{node.lineno} tests {sorted(tested)}")
    assert not bad, bad


HEAVY = {"torch", "transformers", "trl", "peft", "accelerate", "datasets"}
LATE_ON_PURPOSE = {"backends.vllm"}
"""Project modules a module that loads torch may still import late: an optional extra (GPU only)."""


def test_modules_that_load_torch_import_the_project_at_their_top():
    """A late import of a project module saves start-up time only in a module that has not loaded
    torch (or transformers, TRL, ...) already: where it has, the import goes at the top, so a
    module's dependencies read in one place (and an import circle shows at once)."""
    late = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            top = set()
            for node in tree.body:
                if isinstance(node, ast.Import):
                    top.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    top.add(node.module.split(".")[0])
            if not top & HEAVY:
                continue
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for sub in ast.walk(node):
                    if (isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0
                            and sub.module.split(".")[0] in PACKAGES and sub.module not in LATE_ON_PURPOSE):
                        late.append(f"{path.relative_to(ROOT)}:{sub.lineno} {sub.module}")
    assert not late, late


SHORT_FUNCTIONS = ("backends", "reward_models", "rl", "inference", "compare")
"""Packages where no function runs past 60 lines: a longer one is two ideas, each with its name."""


@pytest.mark.parametrize("package", SHORT_FUNCTIONS)
def test_no_function_runs_past_60_lines(package):
    long = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_the_trainer_reads_as_its_phases_and_the_settings_keep_their_size():
    """The PPO trainer holds the loop, under 600 lines: the rollouts, the reward placement, the
    evaluation and the set-up are their own modules; the settings module holds settings, not
    command-line machinery."""
    assert len((ROOT / "rl" / "ppo_trainer.py").read_text().splitlines()) < 600
    assert len((ROOT / "rl" / "ppo_config.py").read_text().splitlines()) <= 450


def test_the_complexity_rule_is_on():
    """ruff's McCabe rule (C901) runs with the lint, at 15 branches a function."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C901" in lint["select"] and lint["mccabe"]["max-complexity"] == 15


def test_inside_the_edge_no_earlier_setting_name_is_read():
    """Earlier setting names (rl/setting_names.py) are translated where settings enter; no module
    past that edge reads one as an attribute or a key."""
    from rl.setting_names import EARLIER_NAMES

    ppo_only = [name for name in EARLIER_NAMES if name not in ("policy", "max_new_tokens")]  # others' flags too
    pattern = __import__("re").compile(r"(\.|\[[\"'])(" + "|".join(ppo_only) + r")\b")
    found = []
    for path in [*(ROOT / "rl").glob("*.py"), *(ROOT / "compare").glob("*.py")]:
        if path.name == "setting_names.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0]):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_old_backends_path_forwards_to_the_same_objects_with_a_warning():
    """`inference.backends` moved to the bottom package `backends`; for one release the old module
    paths give the very same objects, each with one FutureWarning naming the new path."""
    import subprocess
    import sys

    code = ("import warnings; warnings.simplefilter('always')\n"
            "from inference.backends.hf import HFGenerator\n"
            "from inference.backends.model_files import looks_local\n"
            "import backends.hf, backends.model_files\n"
            "assert HFGenerator is backends.hf.HFGenerator and looks_local is backends.model_files.looks_local\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if "FutureWarning" in line]
    assert any("inference.backends.hf moved to backends.hf" in line for line in lines), run.stderr
    assert any("inference.backends.model_files moved to backends.model_files" in line for line in lines)
    help_run = subprocess.run([sys.executable, "-m", "inference.backends.serve", "--help"], cwd=ROOT,
                              capture_output=True, text=True)
    assert help_run.returncode == 0 and "--model" in help_run.stdout, help_run.stderr


@pytest.mark.parametrize("old, new, attr", [("rl.rft", "rl.baselines.rft", "verifier_accepts"),
                                            ("rl.grpo_peer", "rl.baselines.grpo_peer", "main"),
                                            ("rl.checkpoint_curve", "rl.tools.checkpoint_curve", "load_into"),
                                            ("rl.gguf_convert", "rl.tools.gguf_convert", "main"),
                                            ("reward_models.evaluate", "reward_models.verifier_metrics", "main"),
                                            ("reward_models.adapters", "reward_models.step_tag_prms",
                                             "MathShepherdVerifier"),
                                            ("rl.evaluation", "rl.greedy_accuracy", "greedy_eval")])
def test_moved_modules_keep_their_old_paths_for_one_release(old, new, attr):
    """rl/ holds the PPO core; the baselines (rl/baselines/) and the tools around a run (rl/tools/)
    are packages of their own; modules are named for what they hold (one `evaluate`, the harness's);
    each old module path forwards for one release, warning once, and an old command still runs."""
    import subprocess
    import sys

    code = (f"import warnings; warnings.simplefilter('always')\nimport {old} as a, {new} as b\n"
            f"assert a.{attr} is b.{attr}\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"{old} moved to {new}" in run.stderr
    if attr == "main":
        help_run = subprocess.run([sys.executable, "-m", old, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert help_run.returncode == 0 and "--out" in help_run.stdout + help_run.stderr, help_run.stderr
