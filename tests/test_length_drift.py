"""The length-drift guard (rl/length_drift.py): its arithmetic by hand, when it warns, its state in a
checkpoint, and a PPO run on a reward built to be gamed by length, which it catches and stops."""

import json
from pathlib import Path

import pytest
from tiny_world_policy import save_tiny_world_policy

from rl.length_drift import LengthDriftGuard, length_drift, relative_change
from rl.run_dir import RESUME_STATE


def test_length_drift_is_each_measure_s_relative_change_of_the_window_means():
    # first updates: (2 steps, 40 tokens) and (4, 80): means 3 and 60; last: (2, 45) -> -1/3 and -1/4
    drift = length_drift([(2.0, 40.0), (4.0, 80.0)], [(2.0, 45.0)])
    assert drift["rollout/length_drift_steps"] == pytest.approx(-1 / 3)
    assert drift["rollout/length_drift_tokens"] == pytest.approx(-0.25)
    assert drift["rollout/length_drift"] == pytest.approx(-1 / 3)  # the larger magnitude
    # tokens moved more, upwards: the combined drift is theirs, sign kept
    drift = length_drift([(3.0, 60.0)], [(3.3, 30.0), (2.7, 120.0)])
    assert drift["rollout/length_drift_steps"] == pytest.approx(0.0)
    assert drift["rollout/length_drift"] == pytest.approx(0.25)


def test_a_baseline_of_zero_gives_no_drift_and_an_empty_window_is_refused():
    assert relative_change(5.0, 0.0) == 0.0
    assert length_drift([(0.0, 10.0)], [(2.0, 11.0)])["rollout/length_drift"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least one update"):
        length_drift([], [(1.0, 1.0)])


def test_the_guard_reports_after_its_baseline_and_warns_once_per_crossing():
    guard = LengthDriftGuard(updates=2, threshold=0.2)
    seen = [guard.observe(3.0, 60.0), guard.observe(3.0, 60.0)]
    assert seen == [({}, False), ({}, False)]  # the baseline window: nothing to compare yet
    metrics, crossed = guard.observe(3.0, 30.0)  # last two: (3, 60), (3, 30) -> tokens -25%
    assert metrics["rollout/length_drift_tokens"] == pytest.approx(-0.25) and crossed
    metrics, crossed = guard.observe(3.0, 30.0)  # still past: no second warning
    assert metrics["rollout/length_drift"] == pytest.approx(-0.5) and not crossed
    metrics, crossed = guard.observe(3.0, 60.0)  # one update back: mean 45 -> -25%, still past
    assert not crossed
    metrics, crossed = guard.observe(3.0, 60.0)  # mean 60: within
    assert metrics["rollout/length_drift"] == pytest.approx(0.0) and not crossed and not guard.above
    metrics, crossed = guard.observe(4.0, 60.0)  # steps 3.5 against 3: +17%, within
    assert metrics["rollout/length_drift"] == pytest.approx(1 / 6) and not crossed
    metrics, crossed = guard.observe(4.0, 60.0)  # +33%: a new crossing, a new warning
    assert metrics["rollout/length_drift_steps"] == pytest.approx(1 / 3) and crossed
    assert "steps per response 3.00 -> 4.00 (+33%)" in guard.describe(metrics)


def test_a_guard_restored_from_its_state_goes_on_as_the_original():
    original = LengthDriftGuard(updates=2, threshold=0.1)
    for steps, tokens in ((3.0, 60.0), (3.2, 58.0), (2.0, 40.0)):
        original.observe(steps, tokens)
    restored = LengthDriftGuard(updates=2, threshold=0.1)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))  # as a checkpoint stores it
    for steps, tokens in ((2.0, 41.0), (3.1, 59.0), (2.0, 30.0)):
        assert restored.observe(steps, tokens) == original.observe(steps, tokens)
    fresh = LengthDriftGuard(updates=2)
    fresh.load_state_dict({})  # a checkpoint from before the guard: it starts its baseline again
    assert fresh.observe(3.0, 60.0) == ({}, False)


def test_the_guards_settings_are_checked(tmp_path):
    from rl.ppo_config import StepPPOConfig

    for flags, message in (({"length_drift_threshold": 0.0}, "--length_drift_threshold must be > 0"),
                           ({"length_drift_updates": 0}, "--length_drift_updates must be >= 1")):
        with pytest.raises(ValueError, match=message):
            StepPPOConfig(output_dir=str(tmp_path), report_to="none", **flags)


def gamed_run_args(root: Path, out: Path, *extra: str) -> list[str]:
    """A short PPO run whose only varying reward pays for fewer tokens (the answer check of an
    untrained policy is 0 everywhere), at a learning rate that lets the policy learn it in a few updates."""
    policy = root / "policy"
    if not policy.exists():
        save_tiny_world_policy(policy)
        (root / "gamed.py").write_text("def brevity(completion_ids, **kwargs):\n"
                                       "    return [-len(ids) / 8 for ids in completion_ids]\n")
    return ["--model_name_or_path", str(policy), "--build_missing", "false", "--output_dir", str(out),
            "--reward", "gold", "--reward_funcs", f"{root / 'gamed.py'}:brevity", "--max_steps", "12",
            "--prompts_per_update", "4", "--num_generations", "8", "--n_prompts", "16", "--max_completion_length",
            "64", "--num_mini_batches", "2", "--learning_rate", "5e-2", "--n_probe", "0", "--save_steps", "0",
            "--disable_tqdm", "true", "--num_threads", "1", "--report_to", "none", *extra]


def test_a_run_gamed_by_length_is_warned_once_and_stopped_with_its_checkpoint(tmp_path, capsys):
    from rl import ppo_step

    out = tmp_path / "gamed"
    assert ppo_step.main(gamed_run_args(tmp_path, out, "--eval_dataset", "none")) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "length drift" in line]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    drift = {r["update"]: r["rollout/length_drift"] for r in rows if "rollout/length_drift" in r}
    assert sorted(drift) == list(range(4, 13))  # from the update after the 3-update baseline on
    past = [u for u, d in drift.items() if abs(d) > 0.2]
    assert past and drift[past[0]] < -0.2  # the run was paid to shorten, and did
    assert len(past) >= 2 and len(warnings) == 1  # past the threshold for several updates: one warning
    assert f"at update {past[0]}" in warnings[0]
    # the same run with --stop_on_length_drift ends at that update, saved and evaluated as at --max_steps
    stopped = tmp_path / "stopped"
    assert ppo_step.main(gamed_run_args(tmp_path, stopped, "--stop_on_length_drift", "true", "--n_eval", "4")) == 0
    assert f"stopping after update {past[0]} of 12: --stop_on_length_drift" in capsys.readouterr().err
    result = json.loads((stopped / "eval.json").read_text())
    assert result["updates"] == past[0] < 12 and result["stopped_early"] == "length_drift"
    assert "greedy_accuracy_after" in result
    assert (stopped / f"checkpoint-{past[0]}" / "policy").is_dir() and (stopped / "policy").is_dir()
    state = json.loads((stopped / f"checkpoint-{past[0]}" / RESUME_STATE).read_text())
    assert state["length_drift"]["above"] is True  # a resume keeps the baseline and knows it has warned
