"""What a PPO run says as it goes: how many prompts it loaded and what it measures (own data is
measured on its own rows, held apart), a progress bar for the greedy evaluations, where it wrote
(its last line), and a --help that reads as written."""

import json

import pytest

from reasoning.problem_sets import ProblemSet
from reasoning.types import Problem


def _rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "question": f"Ava has {i} marbles and gets 2 more. How many marbles does she have?",
             "answer": str(i + 2)} for i in range(n)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_own_rows_are_split_into_prompts_and_a_held_apart_tail():
    from reasoning.problem_sets import held_apart_count, hold_apart

    problems = [Problem(id=r["id"], question=r["question"], answer=r["answer"]) for r in _rows(20)]
    problems[3] = Problem(id="dup", question=problems[19].question, answer="0")  # repeats a held-apart question
    train, evaluation = hold_apart(ProblemSet("own.jsonl", problems, "train"), n_eval=500, n_train=4000)
    assert [p.id for p in evaluation.problems] == ["r18", "r19"]
    assert len(train.problems) == 17 and "dup" not in [p.id for p in train.problems]
    assert [held_apart_count(n, 500) for n in (0, 1, 2, 19, 20, 10_000)] == [0, 0, 1, 1, 2, 500]
    assert held_apart_count(20, 0) == 0 and held_apart_count(100, 3) == 3
    few, _ = hold_apart(ProblemSet("own.jsonl", problems, "train"), n_eval=500, n_train=5)
    assert len(few.problems) == 5


def test_eval_dataset_auto_is_the_world_on_the_world_and_own_rows_on_own_data(tmp_path):
    from rl.ppo_cli import parse_config

    out = ["--output_dir", str(tmp_path / "run")]
    assert parse_config(out).eval_dataset == "world"
    own = str(_jsonl(tmp_path / "own.jsonl", _rows(20)))
    assert parse_config(["--dataset", own, *out]).eval_dataset == "auto"
    assert parse_config(["--dataset", own, "--eval_dataset", "world", *out]).eval_dataset == "world"


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A one-update gold-reward run on a 20-row file of the user's own, with the default --n_prompts
    and --eval_dataset, and its stdout and stderr."""
    import contextlib
    import io

    from rl import ppo_step
    from tests.tiny_world_policy import save_tiny_world_policy

    root = tmp_path_factory.mktemp("own_run")
    policy = save_tiny_world_policy(root / "policy")
    data = _jsonl(root / "own.jsonl", _rows(20))
    out = root / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["--model_name_or_path", str(policy), "--dataset", str(data), "--reward", "gold", "--build_missing",
            "false", "--output_dir", str(out), "--report_to", "none", "--max_steps", "1", "--prompts_per_update",
            "2", "--num_generations", "2", "--max_completion_length", "8", "--num_threads", "1", "--n_probe", "0",
            "--greedy_eval_batch_size", "1", "--disable_tqdm", "false"]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = ppo_step.main(argv)
    return code, out, data, stdout.getvalue(), stderr.getvalue()


def test_own_data_says_its_prompt_count_and_is_measured_on_its_held_apart_rows(own_run):
    code, out, data, _, err = own_run
    assert code == 0, err[-3000:]
    lines = err.splitlines()
    assert (f"[ppo_step] training prompts: 18 from --dataset {data} (--n_prompts 4000 asks for more: --dataset has "
            "no more usable prompts)") in lines, err[-3000:]
    assert (f"[ppo_step] greedy evaluation before and after: 2 rows of --dataset {data} held apart from training "
            "(its last rows; --eval_dataset auto)") in lines, err[-3000:]
    assert json.loads((out / "eval.json").read_text())["n"] == 2  # the change is measured on those two rows
    before = [json.loads(line)["id"] for line in (out / "eval_before_rows.jsonl").read_text().splitlines()]
    assert before == ["r18", "r19"]


def test_the_greedy_evaluations_show_a_progress_bar_on_stderr(own_run):
    code, _, _, out, err = own_run
    assert code == 0
    assert "greedy eval before" in err and "greedy eval after" in err
    assert "greedy eval" not in out


def test_the_last_line_says_where_the_run_wrote(own_run):
    code, out_dir, _, out, _ = own_run
    assert code == 0
    assert out.splitlines()[-1] == f"wrote {out_dir} (eval.json, metrics.jsonl, policy/)"


def test_help_reads_as_written(capsys):
    from rl import ppo_step

    with pytest.raises(SystemExit):
        ppo_step.main(["--help"])
    text = capsys.readouterr().out
    assert "<class" not in text.lower() and "%%" not in text
    assert "  --warmup_steps float\n" in text and "  --gradient_checkpointing bool\n" in text
    assert "  --output_dir str|None\n" in text and "cost of\n        ~20% slower training" in text


# ----------------------------------------------------------------------------------------------
# the one-process command (`steprl-ppo`, README's command 1): nothing but the toolkit's lines

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _console_script_body(name: str) -> str:
    """What pip's console-script wrapper for NAME runs, from pyproject.toml's [project.scripts] (read
    by hand: tomllib needs Python 3.11)."""
    import re

    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    module, func = re.search(rf'^{re.escape(name)}\s*=\s*"([\w.]+):(\w+)"', section, re.M).groups()
    return f"import sys; from {module} import {func}; sys.exit({func}())"


STEPRL_PPO = _console_script_body("steprl-ppo")


def test_steprl_ppo_exits_through_end_process_so_a_launched_rank_skips_the_interpreter_teardown():
    """The console script's entry is rl.ppo_step.run (main, then rl.distributed.end_process), as is
    `python rl/ppo_step.py`'s: a rank of `accelerate launch` started through either ends alike."""
    from rl import ppo_step

    assert STEPRL_PPO.endswith("sys.exit(run())")
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ppo_step, "main", lambda: 3)
        mp.setattr("rl.distributed.end_process", lambda code: calls.append(code))
        ppo_step.run()
    assert calls == [3]


def _steprl_ppo(argv, cwd):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", STEPRL_PPO, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_quiet_launch_drops_exactly_the_known_noise_lines():
    import logging

    import rl.quiet_launch  # noqa: F401

    def shown(logger: str, message: str) -> bool:
        return logging.getLogger(logger).filter(logging.LogRecord(logger, logging.WARNING, "x", 1, message, None,
                                                                  None))

    assert not shown("DeepSpeed", "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable "
                                  "to detect it.")
    assert not shown("DeepSpeed", "Setting ds_accelerator to cpu (auto detect)")
    assert shown("DeepSpeed", "Setting ds_accelerator to cuda (auto detect)")
    assert shown("DeepSpeed", "Using torch.float32 for the optimizer states")
    tied = "Removed shared tensor {'policy.lm_head.weight'} while saving. This should be OK, but check by verifying"
    assert not shown("accelerate.utils.other", f"[RANK 0] {tied}") and not shown("accelerate.utils.other", tied)
    assert shown("accelerate.utils.other", "[RANK 0] Removed shared tensor {'model.layers.0.mlp.weight'} while saving.")


def test_steprl_ppo_says_bad_input_in_one_line_and_exits_2(tmp_path):
    """The default policy, told not to build it: the toolkit's line alone, where `accelerate launch`
    adds its defaults warning, a traceback and exit 1."""
    done = _steprl_ppo(["--build_missing", "false", "--output_dir", str(tmp_path / "run")], tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == "error: --model_name_or_path outputs/sft_tiny: no such model directory\n", done.stderr


def test_a_one_process_run_prints_no_deepspeed_or_tied_weight_noise(tmp_path):
    from tests.tiny_world_policy import save_tiny_world_policy

    policy = save_tiny_world_policy(tmp_path / "policy")
    out = tmp_path / "run"
    done = _steprl_ppo(["--model_name_or_path", str(policy), "--reward", "gold", "--build_missing", "false",
                        "--output_dir", str(out), "--max_steps", "1", "--save_steps", "1", "--n_eval", "2",
                        "--n_probe", "0", "--prompts_per_update", "2", "--max_completion_length", "8",
                        "--disable_tqdm", "true", "--report_to", "none"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "checkpoint-1").is_dir()  # a checkpoint of the tied-weight policy was saved
    for noise in ("Setting accelerator to CPU", "Setting ds_accelerator", "Removed shared tensor"):
        assert noise not in done.stdout and noise not in done.stderr, noise
    assert done.stdout.splitlines()[-1] == f"wrote {out} (eval.json, metrics.jsonl, policy/)"
