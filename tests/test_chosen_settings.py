"""StepCo's defaults (`auto`) are chosen from what the policy was taught and from held-apart problems,
so they never make a run worse than its first paths; a revision the policy cannot follow is refused."""

import json
import time
from dataclasses import asdict

import pytest

from inference import chosen_settings
from inference import evaluate as ev
from reasoning.world import WorldConfig, taught_tasks

WORLD = WorldConfig(min_steps=1, max_steps=2)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny untrained world policy, taught (by its teacher.json) to solve only."""
    from reasoning.prompts import solve_prompt
    from reasoning.steps import join_steps
    from reasoning.tokenizer import train_tokenizer
    from reasoning.world import generate
    from rl.models import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("policy")
    rows = generate("train", 60, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "world_config.json").write_text(json.dumps(asdict(WORLD)))
    (out / "teacher.json").write_text(json.dumps({"teacher_noise": {}, "tasks": ["explore", "solve"]}))
    return out


def test_taught_tasks_reads_teacher_json_then_eval_json_else_unknown(tmp_path):
    assert taught_tasks(None) is None and taught_tasks("org/some-hub-model") is None
    assert taught_tasks(tmp_path) is None  # a folder rl.sft did not write
    (tmp_path / "eval.json").write_text(json.dumps({"corpus_tasks": {"solve": 1.0, "revise": 0.2, "verify": 0.0}}))
    assert taught_tasks(tmp_path) == ["revise", "solve"]  # a policy from before teacher.json had `tasks`
    (tmp_path / "teacher.json").write_text(json.dumps({"teacher_noise": {}, "tasks": ["solve"]}))
    assert taught_tasks(tmp_path) == ["solve"]


def test_an_explicit_revise_prompt_for_a_policy_not_taught_it_is_refused_before_loading(policy_dir, tmp_path,
                                                                                        capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(ev, "build_generator", no_loading)
    start = time.perf_counter()
    code = ev.main(["--method", "stepco", "--dataset", "world", "--n_world", "3", "--policy", str(policy_dir),
                    "--verifier", "step-confidence", "--revision", "prompt", "--threshold", "0.5",
                    "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and time.perf_counter() - start < 10
    assert err.startswith("error: --revision prompt: ") and err.count("\n") == 1, err
    assert "not taught the revise format" in err and "--revision resample" in err
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_auto_theta_needs_a_held_apart_split(policy_dir, tmp_path, capsys):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "Ann has 2 cats and gets 3. How many?", "answer": "5"}) + "\n")
    code = ev.main(["--method", "stepco", "--dataset", str(data), "--policy", str(policy_dir), "--verifier",
                    "step-confidence", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --threshold auto") and "give --threshold" in err, err
    from inference.methods import stepco

    # no revision round: θ is not used, so nothing needs calibrating
    chosen_settings.check_settings(stepco.Config(max_rounds=0), str(policy_dir), str(data), "step-confidence")


def test_beats_first_paths_asks_the_paired_interval_to_lie_above_zero():
    first = [0.0] * 20 + [1.0] * 20
    assert chosen_settings.beats_first_paths(first, [1.0] * 40)[0] is True
    assert chosen_settings.beats_first_paths(first, list(first))[0] is False  # level: never revise
    worse = [0.0] * 30 + [1.0] * 10
    kept, diff = chosen_settings.beats_first_paths(first, worse)
    assert kept is False and diff["diff"] == pytest.approx(-0.25)


@pytest.mark.parametrize("calibrated", [False, True])
def test_stepco_defaults_choose_revision_and_theta_on_dev_and_cache_them(calibrated, policy_dir, tmp_path, capsys,
                                                                          monkeypatch):
    if calibrated:  # the untrained policy's samples are all wrong (no F1): a θ as if calibrated, to run the check
        import reward_models.verifier_metrics as rm

        monkeypatch.setattr(rm, "calibrate_on_items", lambda *a, **k: {"threshold": 0.5, "f1": 0.5, "n": 32,
                                                                       "skipped": {"total": 0}})
    monkeypatch.setattr(chosen_settings, "CALIBRATION_PROBLEMS", 4)
    monkeypatch.setattr(chosen_settings, "CHECK_PROBLEMS", 6)
    out = tmp_path / "o"
    argv = ["--method", "stepco", "--dataset", "world", "--n_world", "3", "--policy", str(policy_dir),
            "--verifier", "step-confidence", "--max_new_tokens", "12", "--max_rounds", "1", "--out", str(out),
            "--quiet"]
    assert ev.main(argv) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("stepco: ")]
    assert len(lines) == 1 and "revision resample (auto: " in lines[0] and "not the revise format" in lines[0]
    summary = json.loads((out / "summary.json").read_text())
    chosen = summary["chosen"]
    assert chosen["revision"] == "resample" and summary["method_config"]["revision"] == "resample"
    assert summary["method_config"]["threshold"] == chosen["threshold"]
    assert chosen["calibration"]["data"] == "world:dev" and chosen["calibration"]["problems"] == 4
    assert ("dev_check" in chosen) == calibrated
    if calibrated:  # θ kept only when StepCo beat its first paths on the other dev problems
        check = chosen["dev_check"]
        assert check["problems"] == 6
        assert (chosen["threshold"] > 0) == (check["ci95"][0] > 0)
    else:
        assert chosen["threshold"] == 0.0
    cache = json.loads((out / chosen_settings.CACHE).read_text())
    assert cache["chosen"] == {k: v for k, v in chosen.items() if not k.startswith("revision")}
    # dev problems are never the test problems evaluated
    test_questions = {r["question"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    from reasoning.world import generate

    assert not test_questions & {r["question"] for r in generate("dev", 10, 0, WORLD)}
    # a re-run reads the cache (no calibration) and resumes the same run
    monkeypatch.setattr(chosen_settings, "_calibrate", lambda *a, **k: pytest.fail("calibrated again"))
    assert ev.main(argv) == 0
    again = capsys.readouterr().err
    assert f"[from {out / chosen_settings.CACHE}]" in again
    assert json.loads((out / "summary.json").read_text())["chosen"] == chosen


def test_harness_python_api_refuses_settings_left_to_auto(tmp_path):
    from inference.methods import stepco

    with pytest.raises(ev.EvaluationError, match="revision=auto, threshold=auto: choose them first"):
        ev.evaluate("stepco", [], None, None, stepco.Config(), tmp_path / "o")
