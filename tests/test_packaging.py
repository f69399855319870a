"""Packaging: licence, console scripts, py.typed, the constraints file the README and set-up use."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = ("reasoning", "backends", "reward_models", "rl", "inference")


def test_license_is_an_spdx_string_with_its_file():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    # PEP 639 fields need setuptools 77 or later at build time
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=\s*(\d+)", setuptools).group(1)) >= 77


def _main_of(target: str) -> ast.FunctionDef | None:
    module, _, attr = target.partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{target}: module {module} not found"
    assert Path(spec.origin).resolve().is_relative_to(ROOT), f"{module} imports from {spec.origin}"
    tree = ast.parse(Path(spec.origin).read_text())
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == attr), None)


@pytest.mark.parametrize("name", sorted(PYPROJECT["project"].get("scripts", {})))
def test_console_scripts_point_at_a_main_that_takes_argv(name):
    target = PYPROJECT["project"].get("scripts", {})[name]
    main = _main_of(target)
    assert main is not None, f"{name} = {target}: no such function"
    args = main.args
    # console scripts call main() with no arguments: every parameter needs a default
    assert len(args.defaults) == len(args.args), f"{target} has a required argument"


@pytest.mark.parametrize("name", ["steprl-world", "steprl-grade"])
def test_light_console_scripts_answer_help(name, capsys):
    module, _, attr = PYPROJECT["project"].get("scripts", {})[name].partition(":")
    main = getattr(importlib.import_module(module), attr)
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "usage" in capsys.readouterr().out


def test_every_python_m_entry_point_has_a_console_script():
    targets = {t.partition(":")[0] for t in PYPROJECT["project"].get("scripts", {}).values()}
    entry_points = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for package in PACKAGES for p in (ROOT / package).rglob("*.py")
        if 'if __name__ == "__main__":' in p.read_text() and re.search(r"^def main\(", p.read_text(), re.M)
    }
    assert entry_points - targets == set()


def test_packages_ship_py_typed():
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").exists(), package
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["*"]


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name = re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower()
            pins[name] = line[len(name):].replace(" ", "")
    return pins


def test_constraints_file_agrees_with_pyproject_and_is_used():
    constraints = _pins((ROOT / "constraints.txt").read_text().splitlines())
    assert constraints["torch"] == "==2.13.0"
    project = PYPROJECT["project"]
    declared = _pins(project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                                for r in extra])
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "vllm", "deepspeed"):
        assert constraints[name] == declared[name], name
    assert declared["deepspeed"], "the deepspeed extra is pinned"
    assert "-c constraints.txt" in (ROOT / "scripts" / "setup_env.sh").read_text()
    assert "constraints.txt" in (ROOT / "README.md").read_text()
