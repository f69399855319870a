"""Package boundaries: every package imports from this repository, and imports go one way."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reasoning", "reward_models", "rl", "inference", "compare")
# What each part of the toolkit may import from the others (DESIGN.md).
ALLOWED = {
    "reasoning": set(),
    "inference.backends": {"reasoning"},
    "reward_models": {"reasoning", "inference.backends"},
    "rl": {"reasoning", "reward_models", "inference.backends"},
    "inference": {"reasoning", "inference.backends", "reward_models"},
    # the end-to-end comparison is the top floor: it imports every package and nothing imports it
    "compare": {"reasoning", "inference.backends", "reward_models", "rl", "inference"},
}


@pytest.mark.parametrize("name", PACKAGES)
def test_packages_import_from_this_repository(name):
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve().is_relative_to(ROOT), (
        f"{name} imports from {module.__file__}: install the toolkit in its own virtual environment"
    )


def _part(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts
    if parts[0] == "inference" and len(parts) > 1 and parts[1] == "backends":
        return "inference.backends"
    return parts[0]


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
        out.add("inference.backends" if name.startswith("inference.backends") else top)
    return out


def test_imports_go_one_way():
    bad = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            part = _part(path)
            used = _imported_parts(ast.parse(path.read_text())) - {part}
            if part == "inference":
                used.discard("inference.backends")
            illegal = used - ALLOWED[part]
            if illegal:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(illegal)}")
    assert not bad, "\n".join(bad)
