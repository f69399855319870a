"""Bad inputs said in one line, exit 2, before any model loads: broken model folders, misspelt
verifier paths, unwritable output folders, empty and oversized questions; one line per command."""

import json
import os
import shutil
from pathlib import Path

import pytest
from tiny_world_policy import save_tiny_world_policy


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return save_tiny_world_policy(tmp_path_factory.mktemp("input_checks") / "policy")


def _copy(policy: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(policy, target)
    return target


def _truncated(policy, tmp_path):
    broken = _copy(policy, tmp_path, "truncated")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return broken, "model.safetensors: truncated"


def _no_tokenizer(policy, tmp_path):
    broken = _copy(policy, tmp_path, "no_tokenizer")
    for f in broken.glob("tokenizer*"):
        f.unlink()
    return broken, "no tokenizer files"


def _evaluate(argv):
    from inference import evaluate

    return evaluate.main(argv)


def _ppo(argv):
    from rl import ppo_step

    return ppo_step.main(argv)


def _serve(argv):
    from backends import serve

    return serve.main(argv)


def _commands(model: Path, good: Path, tmp_path: Path) -> dict[str, tuple]:
    """Each command that loads `model`, as a policy or as a verifier."""
    out = str(tmp_path / "out")
    world = ["--dataset", "world", "--limit", "2", "--out", out]
    ppo = ["--reward", "gold", "--build_missing", "false", "--output_dir", out]
    return {
        "evaluate": (_evaluate, ["--method", "greedy", "--policy", str(model), *world]),
        "evaluate_verifier": (_evaluate, ["--method", "best_of_n", "--policy", str(good),
                                          "--verifier", f"step-likelihood:{model}", *world]),
        "ppo": (_ppo, ["--policy", str(model), *ppo]),
        "ppo_verifier": (_ppo, ["--policy", str(good), "--reward", "step", "--build_missing", "false",
                                "--verifier", f"step-likelihood:{model}", "--output_dir", out]),
        "serve": (_serve, ["--model", str(model)]),
    }


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("damage", [_truncated, _no_tokenizer], ids=["truncated_weights", "no_tokenizer"])
@pytest.mark.parametrize("command", ["evaluate", "evaluate_verifier", "ppo", "ppo_verifier", "serve"])
def test_a_broken_model_folder_is_named_in_one_line(policy, tmp_path, capsys, damage, command):
    broken, what = damage(policy, tmp_path)
    run, argv = _commands(broken, policy, tmp_path)[command]
    capsys.readouterr()
    assert run(argv) == 2
    line = _one_line_error(capsys)
    assert str(broken) in line and what in line
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_a_truncated_safetensors_header_or_shard_index_is_named(policy, tmp_path):
    from backends.model_files import ModelFilesError, check_model_folder

    cut = _copy(policy, tmp_path, "cut")
    (cut / "model.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(ModelFilesError, match="not even a header"):
        check_model_folder("--policy", cut)
    sharded = _copy(policy, tmp_path, "sharded")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00002.safetensors"}}))
    with pytest.raises(ModelFilesError, match="model-00002.safetensors, a shard that"):
        check_model_folder("--policy", sharded)
    check_model_folder("--policy", policy)  # the whole folder passes


@pytest.mark.parametrize("command", ["evaluate_verifier", "ppo_verifier"])
def test_a_misspelt_verifier_path_is_named_not_taken_for_a_hub_id(policy, tmp_path, capsys, command):
    run, argv = _commands(Path("/nonexistent"), policy, tmp_path)[command]
    capsys.readouterr()
    assert run(argv) == 2
    line = _one_line_error(capsys)
    assert "step-likelihood: /nonexistent: no such model directory" in line and "repo" not in line.lower()


@pytest.mark.parametrize("path, local", [
    ("outputs/sft_tiny_clean", True),   # the toolkit's own folder: a model not built yet
    ("/abs/model", True), ("./model", True), ("~/model", True), ("../model", True),
    ("a/b/c", True),                    # more than one `/`
    ("bad name/x", True), ("org/na--me", True), ("org/", True), ("", True),  # not a Hub id's form
    ("Qwen/Qwen2.5-Math-PRM-7B", False), ("gpt2", False), ("org/name", False),
])
def test_looks_local_is_the_one_rule_for_a_model_path(path, local, tmp_path, monkeypatch):
    from backends.model_files import looks_local

    monkeypatch.chdir(tmp_path)
    assert looks_local(path) is local


def test_a_first_component_that_exists_here_makes_a_path_local(tmp_path, monkeypatch):
    from backends.model_files import looks_local

    monkeypatch.chdir(tmp_path)
    assert not looks_local("runs/policy")
    (tmp_path / "runs").mkdir()
    assert looks_local("runs/policy")


@pytest.mark.parametrize("command", ["evaluate", "evaluate_verifier", "ppo", "ppo_verifier", "serve"])
def test_an_absent_relative_model_path_is_named_not_looked_up_on_the_hub(policy, tmp_path, capsys, monkeypatch,
                                                                         command):
    """`outputs/sft_tiny_clean` before it is built: one line, exit 2, not a Hub error after loading began."""
    monkeypatch.chdir(tmp_path)
    run, argv = _commands(Path("outputs/sft_tiny_clean"), policy, tmp_path)[command]
    if command == "evaluate":  # vLLM takes Hub ids: the one backend that reached the Hub loader
        argv = [*argv, "--backend", "vllm"]
    capsys.readouterr()
    assert run(argv) == 2
    line = _one_line_error(capsys)
    assert "outputs/sft_tiny_clean: no such model directory" in line
    assert not (tmp_path / "out").exists()


def test_reward_model_clis_name_an_absent_relative_model_path_in_one_line(tmp_path, capsys, monkeypatch):
    from reward_models import train as psv_train
    from reward_models.annotate import cli as annotate_cli

    monkeypatch.chdir(tmp_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "Q?", "completions": ["a = 1"], "labels": [1.0]}) + "\n")
    assert psv_train.main(["--data", str(rows), "--init_from", "outputs/sft_tiny", "--output_dir", "v"]) == 2
    assert _one_line_error(capsys) == "error: --init_from outputs/sft_tiny: no such model directory"
    assert annotate_cli.main(["--method", "mc", "--policy", "outputs/sft_tiny", "--data", "world", "--n", "2",
                              "--out", "a.jsonl"]) == 2
    assert _one_line_error(capsys) == "error: --policy outputs/sft_tiny: no such model directory"


def test_rl_sft_names_an_absent_model_path_in_one_line(tmp_path, capsys, monkeypatch):
    from rl import sft

    monkeypatch.chdir(tmp_path)
    assert sft.main(["--model_name_or_path", "outputs/base", "--output_dir", str(tmp_path / "out")]) == 2
    assert _one_line_error(capsys) == "error: --model_name_or_path outputs/base: no such model directory"


def test_the_default_policy_path_is_not_refused_when_it_will_be_built(tmp_path, monkeypatch):
    """`outputs/sft_tiny` absent is built by the run (--build_missing): the input check lets it through,
    and refuses it once the run is told not to build it."""
    from rl.ppo_cli import parse_config
    from rl.ppo_config import ConfigError
    from rl.ppo_setup import check_inputs

    monkeypatch.chdir(tmp_path)
    out = ["--output_dir", str(tmp_path / "run")]
    check_inputs(parse_config(["--reward", "step", *out]))  # the default policy and verifier, both absent
    with pytest.raises(ConfigError, match="outputs/sft_tiny: no such model directory"):
        check_inputs(parse_config(["--reward", "gold", "--build_missing", "false", *out]))


def _unwritable_folders(tmp_path: Path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    yield a_file / "run", "is a file"
    if os.geteuid() != 0:  # root writes anywhere: the permission case only tells as another user
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        yield locked / "run", "cannot write in"
        yield locked, "cannot write in"


def test_an_output_dir_that_cannot_be_written_is_refused_before_any_model_loads(policy, tmp_path, capsys,
                                                                               monkeypatch):
    from rl import ppo_setup

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ppo_setup, "load_policy", no_loading)
    for out, what in _unwritable_folders(tmp_path):
        capsys.readouterr()
        assert _ppo(["--policy", str(policy), "--reward", "gold", "--build_missing", "false",
                     "--output_dir", str(out)]) == 2
        line = _one_line_error(capsys)
        assert f"--output_dir {out}" in line and what in line


def test_check_run_dir_leaves_no_probe_behind(tmp_path):
    from rl.ppo_config import StepPPOConfig
    from rl.run_dir import check_run_dir

    out = tmp_path / "run"
    out.mkdir()
    assert check_run_dir(StepPPOConfig(output_dir=str(out))) == "new"
    assert check_run_dir(StepPPOConfig(output_dir=str(tmp_path / "not" / "yet"))) == "new"
    assert not any(out.iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _problems_file(tmp_path: Path, questions: list[str], seed: int = 3, name: str = "problems.jsonl") -> Path:
    from reasoning.world import generate

    rows = generate("train", len(questions), seed)
    path = tmp_path / name
    path.write_text("".join(json.dumps({"id": f"p{i}", "question": q if q is not None else r["question"],
                                        "answer": str(r["answer"])}) + "\n"
                            for i, (q, r) in enumerate(zip(questions, rows))))
    return path


HUGE = "Hal has 3 apples. " * 5700  # about 100 KB: far beyond the tiny policy's 1024-token context


@pytest.mark.parametrize("blank", ["", "   \n"])
def test_an_empty_question_is_refused_by_evaluate_and_ppo(policy, tmp_path, capsys, monkeypatch, blank):
    from rl import ppo_setup

    monkeypatch.setattr(ppo_setup, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    data = _problems_file(tmp_path, [None, blank, None])
    runs = [
        (_evaluate, ["--method", "greedy", "--policy", str(policy), "--dataset", str(data),
                     "--out", str(tmp_path / "eval")], f"--dataset {data}"),
        (_ppo, ["--policy", str(policy), "--reward", "gold", "--build_missing", "false", "--dataset", str(data),
                "--eval_dataset", "none", "--output_dir", str(tmp_path / "ppo")], f"--dataset {data}"),
        (_ppo, ["--policy", str(policy), "--reward", "gold", "--build_missing", "false", "--eval_dataset", str(data),
                "--output_dir", str(tmp_path / "ppo")], f"--eval_dataset {data}"),
    ]
    for run, argv, source in runs:
        capsys.readouterr()
        assert run(argv) == 2
        line = _one_line_error(capsys)
        assert f"{source}: problem 2 (id 'p1') has an empty question" in line
    assert not (tmp_path / "eval").exists() and not (tmp_path / "ppo").exists()


def test_ppo_leaves_out_a_question_beyond_the_context_and_counts_it(policy, tmp_path, capsys):
    data = _problems_file(tmp_path, [None, HUGE, None, None])
    held_out = _problems_file(tmp_path, [None, HUGE.replace("Hal", "Ivy"), None, None], seed=4,
                              name="held_out.jsonl")  # no question shared with the training prompts
    out = tmp_path / "ppo"
    code = _ppo(["--policy", str(policy), "--reward", "gold", "--build_missing", "false", "--dataset", str(data),
                 "--eval_dataset", str(held_out), "--n_eval", "4", "--n_probe", "0", "--num_updates", "1",
                 "--prompts_per_update", "2", "--samples_per_prompt", "2", "--max_new_tokens", "8",
                 "--disable_tqdm", "true", "--num_threads", "1", "--output_dir", str(out)])
    assert code == 0
    assert json.loads((out / "eval.json").read_text())["prompt_too_long"] == {"train": 1, "eval": 1, "probe": 0}
    err = capsys.readouterr().err
    assert f"--dataset {data}: 1 of 4 problems left out, prompt_too_long" in err and "first: 'p1'" in err
    rows = [json.loads(line) for line in (out / "eval_after_rows.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["p0", "p2", "p3"]


def test_ppo_refuses_a_prompt_set_with_no_prompt_that_fits(policy, tmp_path, capsys):
    data = _problems_file(tmp_path, [HUGE, HUGE])
    capsys.readouterr()
    assert _ppo(["--policy", str(policy), "--reward", "gold", "--build_missing", "false", "--dataset", str(data),
                 "--eval_dataset", "none", "--output_dir", str(tmp_path / "ppo")]) == 2
    assert "every training prompt is longer than the policy's 1024-token context" in capsys.readouterr().err


def test_the_tracker_refuses_a_huge_prompt_without_tokenising_it():
    from backends.base import Completion, SamplingParams
    from inference.methods.base import Tracker

    class Counting:
        context_length, max_token_chars = 1024, 8

        def __init__(self):
            self.counted: list[int] = []

        def count_tokens(self, texts):
            self.counted.extend(len(t) for t in texts)
            return [len(t) // 4 for t in texts]

        def generate(self, prompts, params):
            return [[Completion("x", 1, 1, "stop")] for _ in prompts]

    gen = Counting()
    tracker = Tracker(gen, None, 2)
    out = tracker.generate([0, 1], ["short", HUGE], SamplingParams(max_new_tokens=16))
    assert out[1][0].finish_reason == "prompt_too_long" and tracker.flags == [[], ["prompt_too_long"]]
    assert gen.counted == [len("short")]


def test_annotation_leaves_out_a_question_beyond_the_context_and_refuses_an_empty_one(policy, tmp_path, capsys):
    from reward_models import annotate

    def run(data: Path, out: Path) -> int:
        return annotate.main(["--method", "mc", "--policy", str(policy), "--data", str(data), "--out", str(out),
                              "--paths_per_problem", "1", "--rollouts", "1", "--max_new_tokens", "16",
                              "--disable_tqdm", "true"])

    data = _problems_file(tmp_path, [None, HUGE, None])
    out = tmp_path / "rows.jsonl"
    capsys.readouterr()
    assert run(data, out) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["prompt_too_long"] == 1 and summary["problems"] == 2
    assert f"--data {data}: 1 of 3 problems left out, prompt_too_long" in captured.err
    assert {json.loads(line)["problem_id"] for line in out.read_text().splitlines()} <= {"p0", "p2"}
    empty = _problems_file(tmp_path, [None, "", None])
    assert run(empty, tmp_path / "empty.jsonl") == 2
    line = _one_line_error(capsys)
    assert f"--data {empty}: problem 2 (id 'p1') has an empty question" in line


@pytest.mark.parametrize("spec", ["exact", "exact-noisy:accept=0.5", "product:exact-noisy:accept=0.5,step-confidence"])
def test_a_world_only_verifier_on_other_problems_is_refused_by_evaluate_and_ppo(policy, tmp_path, capsys, spec):
    """The registry says which kinds check world problems only; evaluate and PPO read it there, so
    `exact-noisy` (alone or in a combination) is refused on a user's file as `exact` is, in one line,
    before any model loads."""
    data = _problems_file(tmp_path, [None, None])
    name = spec.split(":")[1].split(",")[0] if spec.startswith("product:") else spec.split(":")[0]
    runs = [
        (_evaluate, ["--method", "best_of_n", "--policy", str(policy), "--dataset", str(data), "--verifier", spec,
                     "--out", str(tmp_path / "eval")]),
        (_ppo, ["--policy", str(policy), "--reward", "step", "--build_missing", "false", "--dataset", str(data),
                "--verifier", spec, "--output_dir", str(tmp_path / "ppo")]),
    ]
    for run, argv in runs:
        capsys.readouterr()
        assert run(argv) == 2
        assert f"the {name} verifier checks world problems only" in _one_line_error(capsys)
    assert not (tmp_path / "eval").exists() and not (tmp_path / "ppo").exists()
