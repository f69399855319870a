"""experiments.step_errors: every own wrong step of a response counted, checked on hand-made paths."""

import json
import random
import re
from dataclasses import asdict

from experiments import step_errors
from reasoning.world import WorldConfig, corrupt_steps, generate, gold_solution

CFG = WorldConfig(min_steps=3, max_steps=3)


def _slip(step: str) -> str:
    """The step with its result one too high: an arithmetic slip that later steps do not carry."""
    return re.sub(r"= (\d+)", lambda m: f"= {int(m.group(1)) + 1}", step, count=1)


def _run(tmp_path, name, completions):
    policy = tmp_path / "policy"
    policy.mkdir(exist_ok=True)
    (policy / "world_config.json").write_text(json.dumps(asdict(CFG)))
    run = tmp_path / name
    run.mkdir()
    (run / "run_config.json").write_text(json.dumps({"model_name_or_path": str(policy), "world_seed": 0,
                                                     "n_eval": len(completions[0])}))
    for which, texts in zip(("before", "after"), completions):
        with (run / f"eval_{which}_rows.jsonl").open("w") as fh:
            for rid, text in texts.items():
                fh.write(json.dumps({"id": rid, "completion": text, "correct": None}) + "\n")
    return str(run)


def test_counts_every_own_error(tmp_path, capsys):
    problems = generate("test", 4, 0, CFG)
    gold = {p["id"]: gold_solution(p) for p in problems}
    first = problems[0]["id"]
    steps = gold[first].split("\n")
    assert len(steps) == 4  # three computations and the answer
    two_slips = "\n".join([_slip(steps[0]), steps[1], _slip(steps[2]), steps[3]])
    errs, n = step_errors.own_errors(problems[0], two_slips)
    # step 1 reads the true value, not the path's slipped one: the checker calls that a wrong operand
    # of its own, not a propagated error; the answer states the true value, so it is right
    assert errs == ["slip", "wrong_operand", "slip"] and n == 4
    carried, _, _ = corrupt_steps(problems[1], random.Random(0), at=0)
    assert step_errors.own_errors(problems[1], "\n".join(carried)) == (["wrong_operand"], 4)  # the rest carried
    assert step_errors.own_errors(problems[0], gold[first]) == ([], 4)
    before = dict(gold, **{first: two_slips})
    run = _run(tmp_path, "r_s0", (before, gold))
    b = step_errors.profile({k: {"completion": v} for k, v in before.items()}, {p["id"]: p for p in problems})
    assert b["errors_per_response"] == 0.75
    assert b["share"] == {"0": 0.75, "1": 0.0, "2": 0.0, "3+": 0.25}
    assert b["by_kind"] == {"slip": 0.5, "wrong_operand": 0.25}
    assert step_errors.main([run, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"]["r_s0"]["change"]["diff"] == -0.75
    assert out["runs"]["r_s0"]["after"]["errors_per_response"] == 0.0


def test_unknown_row_is_an_error(tmp_path, capsys):
    problems = generate("test", 2, 0, CFG)
    rows = {p["id"]: gold_solution(p) for p in problems}
    rows["not-a-problem"] = "x"
    run = _run(tmp_path, "r", (rows, rows))
    assert step_errors.main([run]) == 2
    assert "not-a-problem" in capsys.readouterr().err


def test_follow_carried_counts_a_carried_error_once_under_any_name(tmp_path, capsys):
    problems = generate("test", 2, 0, CFG)
    gold = {p["id"]: gold_solution(p) for p in problems}
    carried, _, _ = corrupt_steps(problems[1], random.Random(0), at=0)
    # the steps that carry the corrupted value give their results names the problem does not have
    misnamed = "\n".join([carried[0], *(re.sub(r"^\w+", "Zed", s) for s in carried[1:3]), carried[3]])
    plain, _ = step_errors.own_errors(problems[1], misnamed)
    assert plain[0] == "wrong_operand" and len(plain) == 4  # each misnamed carry step, and the answer, again
    assert step_errors.own_errors(problems[1], misnamed, follow_carried=True) == (["wrong_operand"], 4)
    before = dict(gold, **{problems[1]["id"]: misnamed})
    run = _run(tmp_path, "r_s0", (before, gold))
    assert step_errors.main([run, "--json", "--follow_carried"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"]["r_s0"]["before"]["errors_per_response"] == 0.5
    assert step_errors.main([run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"]["r_s0"]["before"]["errors_per_response"] == 2.0
