"""experiments.step_credit_compare: arms against a reference at equal tokens, on run folders made here."""

import json

import pytest

from experiments import step_credit_compare as scc


def _run(root, name, correct, curve, tokens, before=0.25):
    """A PPO output folder: `correct` the ids right after training out of 4, `curve` (tokens, probe acc)."""
    run = root / name
    run.mkdir()
    accuracy = len(correct) / 4
    (run / "eval.json").write_text(json.dumps({"greedy_accuracy_after": accuracy, "improvement": accuracy - before,
                                               "generated_tokens": tokens}))
    (run / "eval_after_rows.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "correct": f"p{i}" in correct}) + "\n"
                                                       for i in range(4)))
    rows = [{"update": 0, "probe/greedy_accuracy": curve[0][1]}]
    rows += [{"update": k, "time/update": 1.0, "rollout/tokens_cumulative": t, "probe/greedy_accuracy": a}
             for k, (t, a) in enumerate(curve[1:], start=1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_paired_difference_and_tokens_to_the_references_accuracy(tmp_path, capsys):
    ref = [_run(tmp_path, "gold0", {"p0"}, [(0, 0.2), (500, 0.3), (1000, 0.5)], 1000),
           _run(tmp_path, "gold1", {"p0", "p1"}, [(0, 0.2), (600, 0.5), (1200, 0.5)], 1200)]
    arm = [_run(tmp_path, "prog0", {"p0", "p1"}, [(0, 0.2), (400, 0.5), (900, 0.6)], 900),
           _run(tmp_path, "prog1", {"p0", "p1", "p2"}, [(0, 0.2), (300, 0.4), (700, 0.5)], 700)]
    rows = scc.compare({"gold": ref, "progress": arm}, "gold")
    got = rows[1]
    # per problem, the mean over seeds: gold (1, .5, 0, 0), progress (1, 1, .5, 0): +0.25 over 4 problems
    assert got["minus_reference"]["diff"] == pytest.approx(0.25) and got["minus_reference"]["n"] == 4
    e = got["efficiency"]
    assert e["target"] == pytest.approx(0.5)
    assert e["reference_tokens"] == [1000, 600] and e["arm_tokens"] == [400, 700]
    assert e["ratio"] == pytest.approx(800 / 550) and e["ratio_ci_low"] <= e["ratio"] <= e["ratio_ci_high"]
    assert got["tokens"] == [900, 700] and rows[0]["accuracy_mean"] == pytest.approx(0.375)
    out = tmp_path / "rows.json"
    assert scc.main(["--arm", f"gold={ref[0]},{ref[1]}", "--arm", f"progress={arm[0]},{arm[1]}",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| progress | 0.500 / 0.750 (0.625) |" in printed and "+0.250 [" in printed and "1.45x [" in printed
    assert json.loads(out.read_text())[1]["efficiency"]["arm_tokens"] == [400, 700]


def test_an_arm_that_never_reaches_the_target_is_counted_and_has_no_ratio(tmp_path):
    ref = [_run(tmp_path, "gold0", {"p0", "p1"}, [(0, 0.2), (500, 0.5)], 500)]
    arm = [_run(tmp_path, "flat0", {"p0"}, [(0, 0.2), (500, 0.25)], 500)]
    e = scc.compare({"gold": ref, "flat": arm}, "gold")[1]["efficiency"]
    assert e["arm_tokens"] == [None] and e["arm_not_reached"] == 1 and e["ratio"] is None
    assert "not reached" in scc.table(scc.compare({"gold": ref, "flat": arm}, "gold"), "gold")


def test_bad_input_is_one_line_naming_what(tmp_path, capsys):
    good = _run(tmp_path, "gold0", {"p0"}, [(0, 0.2), (500, 0.5)], 500)
    assert scc.main(["--arm", f"gold={good}", "--arm", f"x={tmp_path / 'absent'}"]) == 2
    assert f"{tmp_path / 'absent' / 'eval.json'}: no such file" in capsys.readouterr().err
    assert scc.main(["--arm", "gold"]) == 2
    assert "give NAME=RUN" in capsys.readouterr().err
    other = _run(tmp_path, "p0", {"p0"}, [(0, 0.2), (500, 0.5)], 500)
    assert scc.main(["--arm", f"gold={good}", "--arm", f"p={other},{other}"]) == 2
    assert "seeds are paired one to one" in capsys.readouterr().err
    assert scc.main(["--arm", f"gold={good}", "--reference", "nope"]) == 2
    assert "is not an --arm" in capsys.readouterr().err
    (good / "eval.json").write_text(json.dumps({"greedy_accuracy_after": 0.5}))
    assert scc.main(["--arm", f"gold={good}"]) == 2
    assert "no generated_tokens" in capsys.readouterr().err
