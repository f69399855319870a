"""scripts/readme_walkthrough.py: every README command meets exactly one rule of the walk (run, cut,
or skipped with a reason), so a command added to the README cannot go unchecked. The walk itself
runs in scripts/check_fresh_install.sh's `readme` phase (minutes: it runs the commands)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_walkthrough", ROOT / "scripts" / "readme_walkthrough.py")
walkthrough = importlib.util.module_from_spec(spec)
sys.modules["readme_walkthrough"] = walkthrough  # its dataclass looks its module up
spec.loader.exec_module(walkthrough)


def test_every_readme_command_meets_one_rule_and_every_rule_a_command():
    steps = walkthrough.plan((ROOT / "README.md").read_text())
    commands = walkthrough.readme_commands((ROOT / "README.md").read_text())
    assert len(steps) == len(commands) > 10
    for line, _command, rule in steps:
        if rule.skip:
            assert len(rule.skip) > 20, f"README.md:{line}: a skip needs its reason"


def test_a_readme_command_the_walk_does_not_know_is_an_error_naming_its_line():
    text = (ROOT / "README.md").read_text() + "\n```bash\npython -m reasoning.nothing --x 1\n```\n"
    with pytest.raises(SystemExit, match=r"README\.md:\d+: 'python -m reasoning\.nothing --x 1' meets 0 rules"):
        walkthrough.plan(text)


def test_a_rule_no_readme_command_meets_is_an_error():
    text = "```bash\nbash scripts/setup_env.sh\n```\n"
    with pytest.raises(SystemExit, match="meets no README command"):
        walkthrough.plan(text)


def test_commands_are_read_as_a_reader_runs_them():
    text = ("prose\n```bash\n# a comment\nbash a.sh && python -m x \\\n  --flag 1   # why\n```\n"
            "```python\nnot = 'a command'\n```\n")
    assert walkthrough.readme_commands(text) == [(4, "bash a.sh"), (4, "python -m x --flag 1")]
    assert (walkthrough.instantiate("python -m rl.sft [--config c.yaml] --method {tree,mc} --policy D")
            == "python -m rl.sft --method tree --policy outputs/sft_tiny")
