"""experiments.verifier_axis: accuracy, tokens and paired differences read from runs, checked by hand."""

import json

import pytest

from experiments import verifier_axis
from reasoning.stats import paired_bootstrap_diff


def _run(folder, correct, tokens):
    folder.mkdir()
    with (folder / "results.jsonl").open("w") as fh:
        for i, (c, (p, g, v)) in enumerate(zip(correct, tokens)):
            usage = {"prompt_tokens": p, "completion_tokens": g, "llm_calls": 1, "verifier_tokens": v,
                     "verifier_calls": 1}
            fh.write(json.dumps({"id": f"p{i}", "correct": c, "usage": usage}) + "\n")
    return str(folder)


def test_axis_by_hand(tmp_path, capsys):
    greedy = _run(tmp_path / "g", [True, False, False, False], [(10, 5, 0)] * 4)
    stepco = _run(tmp_path / "s", [True, True, True, False], [(10, 20, 20)] * 4)
    bon = _run(tmp_path / "b", [True, True, False, False], [(40, 40, 40)] * 4)
    f1 = tmp_path / "f1.json"
    f1.write_text("scoring: 100%\n" + json.dumps({"f1": 0.75, "acc_erroneous": 0.6}) + "\n")
    rows = verifier_axis.axis(greedy, [["v", str(f1), stepco, bon]])
    (r,) = rows
    assert r["f1"] == 0.75
    assert r["greedy"] == {"accuracy": 0.25, "tokens_per_problem": 15.0}
    assert r["stepco"] == {"accuracy": 0.75, "tokens_per_problem": 50.0}  # the verifier's tokens counted
    assert r["best_of_n"] == {"accuracy": 0.5, "tokens_per_problem": 120.0}
    assert r["stepco_minus_bon"]["diff"] == pytest.approx(0.25)
    assert r["stepco_minus_greedy"]["diff"] == pytest.approx(0.5)
    assert r["stepco_minus_bon"]["ci_low"] <= 0.25 <= r["stepco_minus_bon"]["ci_high"]
    out = tmp_path / "axis.png"
    assert verifier_axis.main(["--greedy", greedy, "--level", "v", str(f1), stepco, bon, "--plot", str(out)]) == 0
    assert "| `v` | 0.750 | 0.750 | 50 | 0.500 | 120 | +0.250" in capsys.readouterr().out
    assert out.stat().st_size > 0


def test_axis_refuses_different_problems(tmp_path, capsys):
    greedy = _run(tmp_path / "g", [True, False], [(1, 1, 0)] * 2)
    stepco = _run(tmp_path / "s", [True, False, True], [(1, 1, 0)] * 3)
    f1 = tmp_path / "f1.json"
    f1.write_text(json.dumps({"f1": 1.0}))
    assert verifier_axis.main(["--greedy", greedy, "--level", "v", str(f1), stepco, greedy]) == 2
    assert "different problems" in capsys.readouterr().err


def test_axis_names_a_bad_row(tmp_path, capsys):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"id": "a", "correct": true}\n')
    f1 = tmp_path / "f1.json"
    f1.write_text(json.dumps({"f1": 1.0}))
    assert verifier_axis.main(["--greedy", str(folder), "--level", "v", str(f1), str(folder), str(folder)]) == 2
    assert "results.jsonl: row 1" in capsys.readouterr().err


def test_axis_pools_sampling_seeds_over_problems(tmp_path, capsys):
    """Two seeds: seed k's StepCo is paired with seed k's Best-of-N and with the one greedy run; the
    accuracies are the seeds' means, listed per seed, the intervals over problems; a seed count that
    differs is refused."""
    greedy = _run(tmp_path / "g", [True, False, False, False], [(10, 5, 0)] * 4)
    s0 = _run(tmp_path / "s0", [True, True, False, False], [(10, 20, 10)] * 4)
    s1 = _run(tmp_path / "s1", [True, True, True, True], [(10, 30, 20)] * 4)
    b0 = _run(tmp_path / "b0", [True, False, False, False], [(40, 40, 40)] * 4)
    b1 = _run(tmp_path / "b1", [True, True, True, False], [(40, 40, 0)] * 4)
    f1 = tmp_path / "f1.json"
    f1.write_text(json.dumps({"f1": 0.5}))
    (r,) = verifier_axis.axis(greedy, [["v", str(f1), f"{s0},{s1}", f"{b0},{b1}"]])
    assert r["stepco"] == {"accuracy": 0.75, "tokens_per_problem": 50.0, "accuracy_per_seed": [0.5, 1.0]}
    assert r["best_of_n"] == {"accuracy": 0.5, "tokens_per_problem": 100.0, "accuracy_per_seed": [0.25, 0.75]}
    # per problem, means over the seeds: StepCo 1, 1, .5, .5; Best-of-N 1, .5, .5, 0; greedy 1, 0, 0, 0
    assert r["stepco_minus_bon"]["diff"] == pytest.approx(0.25)
    assert r["stepco_minus_greedy"]["diff"] == pytest.approx(0.5)
    # the interval resamples the four problems with those means, not the eight (seed, problem) pairs
    assert r["stepco_minus_bon"] == paired_bootstrap_diff([1, 0.5, 0.5, 0], [1, 1, 0.5, 0.5])
    assert r["stepco_minus_bon"] != paired_bootstrap_diff([1, 0, 0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1, 1])
    assert verifier_axis.main(["--greedy", greedy, "--level", "v", str(f1), f"{s0},{s1}", f"{b0},{b1}"]) == 0
    assert "| 0.500 / 1.000 | 0.250 / 0.750 |" in capsys.readouterr().out
    assert verifier_axis.main(["--greedy", greedy, "--level", "v", str(f1), f"{s0},{s1}", b0]) == 2
    assert "2 runs against 1" in capsys.readouterr().err
