"""The arithmetic world: determinism, disjoint splits, exact step checking, corruption, CLI."""

import json
import random
import re
import subprocess
import sys

import pytest

from reasoning import world as w
from reasoning.benchmarks import load_benchmark
from reasoning.steps import split_steps


@pytest.fixture(scope="module")
def test_rows():
    return w.generate("test", 200, seed=0)


def test_deterministic_by_seed():
    assert w.generate("train", 30, seed=3) == w.generate("train", 30, seed=3)
    assert w.generate("train", 30, seed=3) != w.generate("train", 30, seed=4)


def test_splits_disjoint_by_construction():
    splits = {s: w.generate(s, 300, seed=0) for s in ("train", "dev", "test")}
    questions = {s: {r["question"] for r in rows} for s, rows in splits.items()}
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["dev"]
    assert not questions["dev"] & questions["test"]
    for s, rows in splits.items():
        assert all(w.split_of(r["question"]) == s for r in rows)
        assert len(questions[s]) == len(rows)  # no duplicates within a split


def test_gold_solutions_check_as_correct(test_rows):
    cfg = w.WorldConfig()
    for row in test_rows:
        assert w.earliest_error(row, row["steps"]) == -1, row
        assert all(c.ok for c in w.check_steps(row, row["steps"]))
        assert cfg.min_steps <= row["world"]["n_steps"] <= cfg.max_steps
        assert row["steps"][-1] == f"The answer is <ans>{row['answer']}</ans>."
        assert row["answer_kind"] == "number"


@pytest.mark.parametrize("kind", w.CORRUPTIONS)
def test_corrupted_paths_locate_the_injected_error(test_rows, kind):
    rng = random.Random(0)
    for row in test_rows:
        for at in range(row["world"]["n_steps"]):
            try:
                steps, index, made = w.corrupt_steps(row, rng, at=at, kind=kind)
            except ValueError:
                continue  # some (step, kind) pairs have no integer-valued corruption
            assert (index, made) == (at, kind)
            assert w.earliest_error(row, steps) == at, (row["question"], steps)
            # an injected wrong operand or operation may be one a reader is taught (a stale count, an
            # inverse phrasing read as written): it is then classified as that misreading
            specific = {"wrong_operand": {"misread_stale"}, "wrong_operation": {"misread_inverse", "misread_direct"}}
            assert w.error_kind(row, steps) in {kind} | specific.get(kind, set())
            checks = w.check_steps(row, steps)
            # Every later wrong step only carries the injected error forward.
            assert all(c.ok or c.kind == "propagated" for c in checks[at + 1 :]), checks


def test_random_corruption_covers_every_kind(test_rows):
    rng = random.Random(1)
    kinds = {w.corrupt_steps(row, rng)[2] for row in test_rows}
    assert kinds == set(w.CORRUPTIONS)


HAND = {
    "question": "Ava has 7 marbles. Ava gives away 2 marbles. Ben has 3 more marbles than Ava. "
    "Ava is 9 years old. How many marbles does Ben have?",
    "answer": "8",
    "steps": ["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 + 3 = 8 marbles.", "The answer is <ans>8</ans>."],
    "world": {
        "item": "marbles",
        "target": "Ben",
        "n_steps": 2,
        "distractors": ["Ava is 9 years old."],
        "quantities": {
            "Ava": {"key": "Ava", "value": 7, "op": None, "args": [], "needed": False},
            "Ava@now": {"key": "Ava@now", "value": 5, "op": "lose", "args": ["Ava", 2], "needed": True},
            "Ben": {"key": "Ben", "value": 8, "op": "add", "args": ["Ava@now", 3], "needed": True},
        },
    },
}


@pytest.mark.parametrize(
    "steps, index, kind",
    [
        (HAND["steps"], -1, None),
        # Stale value: Ben's relation refers to Ava after the event.
        (["Ben has 7 + 3 = 10 marbles.", "The answer is <ans>10</ans>."], 0, "misread_stale"),
        # Distractor number used.
        (["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 + 9 = 14 marbles.", "The answer is <ans>14</ans>."],
         1, "wrong_operand"),
        # A directly phrased relation ("3 more than Ava") computed with the inverse operation: the
        # mirror of the taught misreading, named apart from other wrong operations.
        (["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 - 3 = 2 marbles.", "The answer is <ans>2</ans>."],
         1, "misread_direct"),
        (["Ava now has 7 - 2 = 5 marbles.", "Zed has 5 - 3 = 2 marbles.", "The answer is <ans>2</ans>."],
         1, "misread_direct"),
        (["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 * 3 = 15 marbles.", "The answer is <ans>15</ans>."],
         1, "wrong_operation"),
        (["Ava now has 7 - 2 = 4 marbles.", "Ben has 4 + 3 = 7 marbles.", "The answer is <ans>7</ans>."], 0, "slip"),
        (["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 + 3 = 8 marbles.", "The answer is <ans>5</ans>."],
         2, "wrong_answer"),
        (["Ava now has 7 - 2 = 5 marbles.", "Ben has 5 + 3 = 8 marbles."], 2, "missing_answer"),
        (["Ava now has 7 - 2 = 5 marbles.", "so Ben is bigger"], 1, "format"),
        (["Zed has 7 + 4 = 11 marbles.", "The answer is <ans>11</ans>."], 0, "unknown_quantity"),
        # the stale reading under a name the problem does not have is still the stale reading
        (["Zed has 7 + 3 = 10 marbles.", "The answer is <ans>10</ans>."], 0, "misread_stale"),
        ([], 0, "missing_answer"),
    ],
)
def test_hand_written_paths(steps, index, kind):
    assert w.earliest_error(HAND, steps) == index
    assert w.error_kind(HAND, steps) == kind


def test_propagated_errors_are_labelled():
    steps = ["Ava now has 7 - 2 = 6 marbles.", "Ben has 6 + 3 = 9 marbles.", "The answer is <ans>9</ans>."]
    kinds = [c.kind for c in w.check_steps(HAND, steps)]
    assert kinds == ["slip", "propagated", "propagated"]


@pytest.mark.parametrize(
    "steps, default, followed",
    [
        # Ben's step on the slipped value, under a name the problem does not have: without
        # follow_carried an own error, and so is the answer that states its value
        (["Ava now has 7 - 2 = 6 marbles.", "Cal has 6 + 3 = 9 marbles.", "The answer is <ans>9</ans>."],
         ["slip", "unknown_quantity", "wrong_answer"], ["slip", "propagated", "propagated"]),
        # ... under the name of another quantity of the problem
        (["Ava now has 7 - 2 = 6 marbles.", "Ava has 6 + 3 = 9 marbles.", "The answer is <ans>9</ans>."],
         ["slip", "other", "wrong_answer"], ["slip", "propagated", "propagated"]),
        # a wrong operand under another name stays an own error: it is no quantity's step on the carried value
        (["Ava now has 7 - 2 = 6 marbles.", "Cal has 6 + 4 = 10 marbles.", "The answer is <ans>10</ans>."],
         ["slip", "unknown_quantity", "wrong_answer"], ["slip", "unknown_quantity", "wrong_answer"]),
        # on the true values it is a right step under the wrong name, as before
        (["Ava now has 7 - 2 = 5 marbles.", "Cal has 5 + 3 = 8 marbles.", "The answer is <ans>8</ans>."],
         ["correct"] * 3, ["correct"] * 3),
        # the quantity's own name: propagated either way; the stale reading stays a misreading
        (["Ava now has 7 - 2 = 6 marbles.", "Ben has 6 + 3 = 9 marbles.", "The answer is <ans>9</ans>."],
         ["slip", "propagated", "propagated"], ["slip", "propagated", "propagated"]),
        (["Ben has 7 + 3 = 10 marbles.", "The answer is <ans>10</ans>."],
         ["misread_stale", "propagated"], ["misread_stale", "propagated"]),
    ],
)
def test_follow_carried_counts_a_misnamed_step_on_carried_values_as_propagated(steps, default, followed):
    plain = w.check_steps(HAND, steps)
    carried = w.check_steps(HAND, steps, follow_carried=True)
    assert [c.kind for c in plain] == default
    assert [c.kind for c in carried] == followed
    assert [c.ok for c in carried] == [c.ok for c in plain]  # it names errors; it never judges a step again
    for c, was in zip(carried, plain):
        if c.kind == "propagated" and was.kind != "propagated" and c.key != "Ben":  # a misnamed carry step
            assert c.naming_slip and c.claimed == "9" and c.true == "8"


def test_follow_carried_never_changes_which_steps_are_right(test_rows):
    """Over corrupted and misnamed paths of many problems, the verdicts agree step by step."""
    rng = random.Random(3)
    names = ["Zed", "Ava", "Ben", "Cal"]
    seen = 0
    for row in test_rows:
        steps, at, _ = w.corrupt_steps(row, rng)
        steps = [re.sub(r"^\w+", rng.choice(names), s) if i > at and "answer" not in s else s
                 for i, s in enumerate(steps)]
        plain, carried = w.check_steps(row, steps), w.check_steps(row, steps, follow_carried=True)
        assert [c.ok for c in plain] == [c.ok for c in carried]
        seen += sum(a.kind != b.kind for a, b in zip(plain, carried))
    assert seen > 0  # misnamed carry steps were there to be found


def test_checker_parses_generated_text_through_segmentation(test_rows):
    row = test_rows[0]
    text = "\n".join(f"<Step>{s}</Step>" for s in row["steps"])
    assert w.earliest_error(row, split_steps(text).steps) == -1


def test_distractors_and_inverse_phrasing_appear():
    rows = w.generate("train", 300, seed=0, config=w.WorldConfig(min_distractors=1, max_distractors=2, p_inverse=1.0))
    assert all(r["world"]["distractors"] for r in rows)
    assert all(d in r["question"] for r in rows for d in r["world"]["distractors"])
    assert any(" fewer " in r["question"] and "+" in " ".join(r["steps"]) for r in rows)


@pytest.mark.parametrize("bad", [dict(min_steps=0), dict(min_steps=5, max_steps=3), dict(max_steps=9),
                                 dict(max_factor=7), dict(ops=("pow",)), dict(p_inverse=1.5),
                                 dict(min_distractors=3, max_distractors=1)])
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValueError):
        w.WorldConfig(**bad)


def test_steps_knob_reaches_eight():
    rows = w.generate("test", 20, seed=0, config=w.WorldConfig(min_steps=8, max_steps=8, n_names=20))
    assert all(r["world"]["n_steps"] == 8 for r in rows)
    assert all(w.earliest_error(r, r["steps"]) == -1 for r in rows)


def test_cli_writes_benchmark_schema(tmp_path):
    out = tmp_path / "world_test.jsonl"
    proc = subprocess.run([sys.executable, "-m", "reasoning.world", "--split", "test", "--n", "25", "--seed", "0",
                           "--out", str(out)], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["n"] == 25
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == w.generate("test", 25, seed=0)
    assert all(isinstance(r[k], str) for r in rows for k in ("id", "question", "answer"))
    problems = load_benchmark(str(out))
    assert [p.id for p in problems] == [r["id"] for r in rows]
    assert all(w.earliest_error(p, p.meta["steps"]) == -1 for p in problems)


def test_cli_rejects_bad_knobs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reasoning.world", "--n", "5", "--max_steps", "12",
                           "--out", str(tmp_path / "x.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 2 and "max_steps" in proc.stderr


def test_world_config_of_reads_what_sft_saves(tmp_path, capsys):
    from dataclasses import asdict

    cfg = w.WorldConfig(max_steps=5, ops=("add", "sub"), n_names=12)
    (tmp_path / "world_config.json").write_text(json.dumps(asdict(cfg)))
    assert w.world_config_of(tmp_path) == cfg
    assert w.world_config_of(tmp_path / "missing") == w.WorldConfig()
    assert w.world_config_of(None) == w.WorldConfig()
    assert capsys.readouterr().err == ""  # a saved world, no folder or no policy: nothing to say


def test_a_policy_folder_without_its_world_is_named_when_the_default_world_stands_in(tmp_path, capsys):
    """A model trained outside rl.sft has no world_config.json: the default world is used, and said."""
    (tmp_path / "policy").mkdir()
    assert w.world_config_of(tmp_path / "policy") == w.WorldConfig()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "policy") in err and "world_config.json" in err
    assert f"inverse phrasings {w.WorldConfig().p_inverse}" in err


# ---------------------------------------------------------------------------------------------
# The checker judges what a step computes; names are checked apart


INVERSE = {
    "question": "Ava has 6 marbles. Ava has 4 fewer marbles than Fay. Hal has 2 marbles. "
    "How many marbles does Fay have?",
    "answer": "10",
    "steps": ["Fay has 6 + 4 = 10 marbles.", "The answer is <ans>10</ans>."],
    "world": {
        "item": "marbles", "target": "Fay", "n_steps": 1, "distractors": [],
        "quantities": {
            "Ava": {"key": "Ava", "value": 6, "op": None, "args": [], "needed": False},
            "Hal": {"key": "Hal", "value": 2, "op": None, "args": [], "needed": False},
            "Fay": {"key": "Fay", "value": 10, "op": "add", "args": ["Ava", 4], "needed": True, "inverse": True},
        },
    },
}


def test_a_right_computation_under_another_name_is_a_naming_slip():
    steps = ["Hal has 6 + 4 = 10 marbles.", "The answer is <ans>10</ans>."]
    checks = w.check_steps(INVERSE, steps)
    assert [c.ok for c in checks] == [True, True]
    assert checks[0].naming_slip and checks[0].key == "Fay"
    assert w.earliest_error(INVERSE, steps) == -1
    # the strict reading counts the name: the step names Hal, whose count is 2
    assert w.earliest_error(INVERSE, steps, strict=True) == 0
    assert w.error_kind(INVERSE, steps, strict=True) == "other"
    # a wrong computation is wrong whatever it is called
    assert w.earliest_error(INVERSE, ["Hal has 6 + 3 = 9 marbles.", "The answer is <ans>9</ans>."]) == 0


def test_misread_relations_are_still_the_earliest_error():
    misread = ["Fay has 6 - 4 = 2 marbles.", "The answer is <ans>2</ans>."]
    assert w.earliest_error(INVERSE, misread) == 0
    assert w.error_kind(INVERSE, misread) == "misread_inverse"
    # also under a wrong name (the tiny policy misnames often)
    assert w.error_kind(INVERSE, ["Hal has 6 - 4 = 2 marbles.", "The answer is <ans>2</ans>."]) == "misread_inverse"


def test_teacher_misreadings_are_consistent_and_located(test_rows):
    counts = {"inverse": 0, "stale": 0}
    for row in test_rows:
        for kind in w.misreadings_of(row):
            steps = w.teacher_solution(row, (kind,))
            checks = w.check_steps(row, steps)
            first = next(i for i, c in enumerate(checks) if not c.ok)
            assert checks[first].kind == f"misread_{kind}", (row["question"], steps, checks)
            # every step's arithmetic holds: the misreading is carried, not a slip
            assert all(c.kind != "slip" for c in checks)
            counts[kind] += 1
    assert counts["inverse"] > 10 and counts["stale"] > 10, counts
    assert w.teacher_solution(HAND, ("inverse",)) is None  # no inverse phrasing in HAND
    assert w.teacher_solution(HAND, ("stale",)) == ["Ben has 7 + 3 = 10 marbles.", "The answer is <ans>10</ans>."]
    with pytest.raises(ValueError):
        w.teacher_solution(HAND, ("sloppy",))


def test_generation_records_inverse_phrasing(test_rows):
    inverse = [q for r in test_rows for q in r["world"]["quantities"].values() if q.get("inverse")]
    assert inverse and all(q["op"] in ("add", "sub", "mul", "div") for q in inverse)


def test_numbers_too_long_to_parse_are_format_errors_not_crashes():
    huge = "9" * 4301
    assert w.error_kind(HAND, [f"Ava now has 7 - 2 = {huge} marbles."]) == "format"
    assert w.error_kind(HAND, [f"The answer is <ans>{huge}</ans>."]) == "format"
    assert w.error_kind(HAND, [f"Ava now has {huge} - 2 = 5 marbles."]) in ("format", "slip")


def test_name_use_figures_by_hand(tmp_path, capsys):
    """experiments/name_use.py on paths written by hand: the gold steps (names right), the same steps all
    under one name (every right computation a naming slip) and a wrong path under a name the problem
    does not have (an unknown_quantity error)."""
    from experiments.name_use import main, name_use, step_names
    from reasoning.steps import join_steps

    rows = w.generate("test", 3, 0)
    by_id = {r["id"]: r for r in rows}
    p0, p2 = rows[0], rows[2]  # 3 computation steps each, three different names
    assert step_names(p0["steps"]) == ["Ava", "Gus", "Jay"]
    assert step_names(["Together they have 1 + 2 = 3 coins.", "The answer is <ans>3</ans>."]) == []

    def one_name(steps, name):
        return [re.sub(r"^[A-Z][a-z]+ (now )?has", lambda m: f"{name} {m.group(1) or ''}has", s) for s in steps]

    gold = [{"id": p["id"], "completion": join_steps(p["steps"]), "correct": True} for p in (p0, p2)]
    assert name_use(gold, by_id) == {
        "paths": 2, "multi_step_paths": 2, "one_name": 0.0, "top_name": "Ava", "top_name_share": 1 / 6,
        "right_steps": 6, "naming_slips": 0.0, "unknown_quantity_errors": 0}
    renamed = [{"id": p0["id"], "completion": join_steps(one_name(p0["steps"], "Gus")), "correct": True}]
    # Gus is one of p0's people: his own step is named right, the two others are slips
    assert name_use(renamed, by_id)["one_name"] == 1.0 and name_use(renamed, by_id)["naming_slips"] == 2 / 3
    wrong = [{"id": p2["id"], "completion": join_steps(["Zed has 2 + 2 = 4 marbles.", "The answer is <ans>4</ans>."]),
              "correct": False}]
    assert name_use(wrong, by_id) == {
        "paths": 1, "multi_step_paths": 0, "one_name": None, "top_name": "Zed", "top_name_share": 1.0,
        "right_steps": 0, "naming_slips": None, "unknown_quantity_errors": 1}

    run = tmp_path / "run_s0"
    run.mkdir()
    policy = tmp_path / "policy"
    policy.mkdir()
    (run / "run_config.json").write_text(json.dumps({"policy": str(policy), "world_seed": 0, "n_eval": 3}))
    (run / "eval_before_rows.jsonl").write_text("\n".join(json.dumps(r) for r in gold))
    (run / "eval_after_rows.jsonl").write_text("\n".join(json.dumps(r) for r in renamed))
    assert main([str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_s0 before"]["naming_slips"] == 0.0 and out["run_s0 after"]["one_name"] == 1.0
    (run / "eval_after_rows.jsonl").write_text(json.dumps({"id": "world-test-9-0", "completion": "", "correct": False}))
    assert main([str(run)]) == 2 and "not one of the rebuilt world problems" in capsys.readouterr().err
    (run / "run_config.json").unlink()
    assert main([str(run)]) == 2 and "--policy" in capsys.readouterr().err


def test_reward_on_paths_scores_by_hand(tmp_path, capsys, monkeypatch):
    """experiments/reward_on_paths.py with a verifier that scores a step 0.9 when it says `right` and 0.2
    otherwise: a right path (0.9, 0.9), a wrong one (0.9, 0.2), an empty one (counted, not scored); the
    command reads the policy from a PPO run's `model_name_or_path`, and every input error exits 2 before
    the verifier is loaded."""
    import reward_models.load
    from experiments.reward_on_paths import main, score_rows
    from reasoning.steps import join_steps

    class Marked:
        def __init__(self):
            self.seen = []

        def score(self, questions, paths):
            self.seen.extend(questions)
            return [[0.9 if "right" in s else 0.2 for s in steps] for steps in paths]

    problems = w.generate("test", 3, 0)
    questions = {p["id"]: p["question"] for p in problems}
    rows = [{"id": problems[0]["id"], "completion": join_steps(["a right", "b right"]), "correct": True},
            {"id": problems[1]["id"], "completion": join_steps(["a right", "wrong"]), "correct": False},
            {"id": problems[2]["id"], "completion": "", "correct": False}]
    verifier = Marked()
    got = score_rows(verifier, rows, questions, batch_size=1)
    assert got == pytest.approx({"paths": 3, "empty_paths": 1, "accuracy": 1 / 3, "min_score": (0.9 + 0.2) / 2,
                                 "mean_score": (0.9 + 0.55) / 2, "min_score_right": 0.9, "min_score_wrong": 0.2,
                                 "steps": 2.0})
    assert verifier.seen == [problems[0]["question"], problems[1]["question"]]  # each path with its own question
    with pytest.raises(KeyError, match="not one of the rebuilt"):
        score_rows(verifier, [{"id": "world-test-9-0", "completion": "", "correct": False}], questions)

    run = tmp_path / "run_s0"
    run.mkdir()
    policy = tmp_path / "policy"
    policy.mkdir()
    (run / "run_config.json").write_text(json.dumps({"model_name_or_path": str(policy), "world_seed": 0, "n_eval": 3}))
    (run / "eval_before_rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows[1:]))
    (run / "eval_after_rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]))
    monkeypatch.setattr(reward_models.load, "load_verifier", lambda spec: Marked())
    assert main([str(run), "--verifier", "any", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_s0 before"]["min_score"] == pytest.approx(0.2) and out["run_s0 before"]["empty_paths"] == 1
    assert out["run_s0 after"]["min_score"] == pytest.approx(0.55) and out["run_s0 after"]["accuracy"] == 0.5

    def never(spec):
        raise AssertionError("the verifier was loaded before the inputs were checked")

    monkeypatch.setattr(reward_models.load, "load_verifier", never)
    (run / "eval_after_rows.jsonl").write_text(json.dumps(rows[0]) + "\n{not json\n")
    assert main([str(run), "--verifier", "any"]) == 2 and "eval_after_rows.jsonl:2" in capsys.readouterr().err
    (run / "eval_after_rows.jsonl").unlink()
    assert main([str(run), "--verifier", "any"]) == 2 and "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing"), "--verifier", "any"]) == 2 and "not a run folder" in capsys.readouterr().err


def test_gain_by_kind_splits_the_change_by_decision_by_hand(tmp_path, capsys):
    """experiments/gain_by_kind.py on rows written by hand: an inverse and a stale problem go from the
    taught misreading to the gold path (won), a problem with neither goes from gold to a directly
    phrased relation computed with the inverse operation (lost, a `misread_direct` error)."""
    from experiments.gain_by_kind import main
    from reasoning.steps import join_steps

    rows = w.generate("test", 60, 0)
    inverse = next(r for r in rows if w.misreadings_of(r) == ["inverse"])
    stale = next(r for r in rows if w.misreadings_of(r) == ["stale"])

    def flipped(row):  # the first direct + or - relation step computed with the other operation
        for i, step in enumerate(row["steps"][:-1]):
            m = re.match(r"^(\w+ (?:now )?has) (\d+) ([+-]) (\d+) = (\d+) (\w+)\.$", step)
            key = step.split(" ")[0] + ("@now" if " now " in step else "")
            q = row["world"]["quantities"].get(key, {})
            if m and q.get("op") in ("add", "sub") and not q.get("inverse"):
                x, y = int(m.group(2)), int(m.group(4))
                sym, value = ("-", x - y) if m.group(3) == "+" else ("+", x + y)
                if value >= 0 and i == len(row["steps"]) - 2:
                    return [*row["steps"][:i], f"{m.group(1)} {x} {sym} {y} = {value} {m.group(6)}.",
                            f"The answer is <ans>{value}</ans>."]
        return None

    neither = next(r for r in rows if not w.misreadings_of(r) and flipped(r) is not None)
    assert w.error_kind(neither, flipped(neither)) == "misread_direct"

    def row(r, steps, correct):
        return json.dumps({"id": r["id"], "completion": join_steps(steps), "correct": correct})

    before = [row(inverse, w.teacher_solution(inverse, ("inverse",)), False),
              row(stale, w.teacher_solution(stale, ("stale",)), False), row(neither, neither["steps"], True)]
    after = [row(inverse, inverse["steps"], True), row(stale, stale["steps"], True),
             row(neither, flipped(neither), False)]
    policy = tmp_path / "policy"
    policy.mkdir()
    for seed in (0, 1):
        run = tmp_path / f"run_s{seed}"
        run.mkdir()
        (run / "run_config.json").write_text(json.dumps({"policy": str(policy), "world_seed": 0, "n_eval": 60}))
        (run / "eval_before_rows.jsonl").write_text("\n".join(before))
        (run / "eval_after_rows.jsonl").write_text("\n".join(after))
    ref = tmp_path / "clean"
    ref.mkdir()
    (ref / "eval_rows.jsonl").write_text("\n".join(after))
    assert main([str(tmp_path / "run_s0"), str(tmp_path / "run_s1"), "--reference", str(ref),
                 "--resamples", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    parts = out["parts"]["run_s0"]
    assert {k: (v["n"], v["before"], v["after"], v["won"], v["lost"]) for k, v in parts.items()} == {
        "inverse": (1, 0.0, 1.0, 1, 0), "stale": (1, 0.0, 1.0, 1, 0), "neither": (1, 1.0, 0.0, 0, 1),
        "all": (3, 1 / 3, 2 / 3, 2, 1)}
    assert parts["all"]["diff"] == pytest.approx(1 / 3)
    pooled = out["parts"]["run (pooled, 2 seeds)"]
    assert pooled["all"]["n"] == 6 and pooled["all"]["won"] == 2 and pooled["neither"]["lost"] == 1
    assert out["parts"]["clean (reference)"]["all"]["after"] == pytest.approx(2 / 3)
    assert out["error_mix"]["before"] == {"misread_inverse": 1, "misread_stale": 1}
    assert out["error_mix"]["run_s0"] == {"misread_direct": 1}
    assert out["error_mix"]["clean (reference)"] == {"misread_direct": 1}
    # a run from another starting policy gets its own `before` error mix
    other = tmp_path / "other"
    other.mkdir()
    (other / "run_config.json").write_text(json.dumps({"policy": str(policy), "world_seed": 0, "n_eval": 60}))
    (other / "eval_before_rows.jsonl").write_text("\n".join(after))
    (other / "eval_after_rows.jsonl").write_text("\n".join(after))
    assert main([str(tmp_path / "run_s0"), str(other), "--resamples", "20", "--json"]) == 0
    mixes = json.loads(capsys.readouterr().out)["error_mix"]
    assert mixes["before"] == {"misread_inverse": 1, "misread_stale": 1}
    assert mixes["other before"] == {"misread_direct": 1} and "run_s0 before" not in mixes
    # the table form, and bad input: rows of problems the run's world does not have, a missing file
    assert main([str(tmp_path / "run_s0"), "--resamples", "50"]) == 0
    assert "| run_s0 | neither | 1 | 1.000 | 0.000 | 0 | 1 |" in capsys.readouterr().out
    (ref / "eval_rows.jsonl").write_text("\n".join(after[:2]))
    assert main([str(tmp_path / "run_s0"), "--reference", str(ref)]) == 2
    assert "covers other problems" in capsys.readouterr().err
    (tmp_path / "run_s1" / "eval_after_rows.jsonl").unlink()
    assert main([str(tmp_path / "run_s1")]) == 2 and "does not exist" in capsys.readouterr().err


def test_greedy_evaluation_classifies_errors_through_the_problems_hooks(tmp_path):
    """The greedy evaluation (and the trainer) reach the world's error kinds and settings files only
    through `ProblemHooks`: the world's classify world problems; with none, a row has no kind."""
    from backends.base import Completion
    from reasoning.steps import join_steps
    from rl.greedy_accuracy import greedy_eval
    from rl.problem_hooks import NO_HOOKS, WORLD_HOOKS

    rows = w.generate("test", 2, 0)
    problems = [w.row_to_problem(r) for r in rows]
    texts = [join_steps(rows[0]["steps"]), "<Step> I do not know.</Step>"]

    class Scripted:
        def generate(self, prompts, params):
            return [[Completion(t, 0, 5, "stop")] for t in texts]

    world = greedy_eval(Scripted(), problems, hooks=WORLD_HOOKS)
    assert world["rows"][0]["error_kind"] is None and world["rows"][1]["error_kind"]
    assert sum(world["summary"]["error_mix"].values()) == 1
    plain = greedy_eval(Scripted(), problems, hooks=NO_HOOKS)
    assert all("error_kind" not in r for r in plain["rows"]) and "error_mix" not in plain["summary"]
    assert [r["correct"] for r in plain["rows"]] == [r["correct"] for r in world["rows"]]

    source = tmp_path / "policy"
    source.mkdir()
    (source / "world_config.json").write_text("{}")
    assert WORLD_HOOKS.carry_files(source, tmp_path / "trained") == ["world_config.json"]
    assert NO_HOOKS.carry_files(source, tmp_path / "other") == [] and not (tmp_path / "other").exists()


def test_only_world_datasets_read_the_policy_world(tmp_path, capsys):
    """A benchmark file evaluated with a model trained outside rl.sft (a real pretrained model) draws
    no world problems, so no note about its missing world_config.json; the world dataset still says it."""
    from inference.evaluate import load_problems, parse_args
    from reasoning.problem_sets import is_world_name

    assert is_world_name("world") and is_world_name("world:dev")
    assert not is_world_name("worlds.jsonl") and not is_world_name(None) and not is_world_name("none")
    policy = tmp_path / "policy"
    policy.mkdir()
    data = tmp_path / "bench.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5"}) + "\n")
    args, _, _ = parse_args(["--method", "greedy", "--dataset", str(data), "--policy", str(policy),
                             "--out", str(tmp_path / "out")])
    problems, _ = load_problems(args)
    assert [p.answer for p in problems] == ["5"]
    assert "world_config.json" not in capsys.readouterr().err
    args, _, _ = parse_args(["--method", "greedy", "--dataset", "world", "--n_world", "3", "--policy", str(policy),
                             "--out", str(tmp_path / "out2")])
    assert len(load_problems(args)[0]) == 3
    assert "world_config.json" in capsys.readouterr().err
