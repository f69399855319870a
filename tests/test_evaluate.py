"""Step-level evaluation: the ProcessBench metric, calibration, Best-of-N, the verifier specs, the CLI."""

import json
from dataclasses import asdict

import pytest
import torch

from reasoning.benchmarks import default_data_dir
from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, generate
from reward_models import verifier_metrics as ev
from reward_models.load import load_verifier, psv_dir_kind
from reward_models.verifier_metrics import (
    best_of_n_accuracy,
    calibrate_threshold,
    earliest_error_predictions,
    processbench_metrics,
)

# A world the tiny policy below half-memorises: its samples hold both right and wrong paths.
WORLD = WorldConfig(min_steps=1, max_steps=2, max_distractors=0, p_together=0.0)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny Llama trained for a few seconds on the gold paths of 4 world test problems, saved with the
    world config it saw (so `--data world --limit 4` regenerates exactly those problems)."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("policy")
    rows = generate("test", 4, 0, WORLD)
    texts = [solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows]
    tok = train_tokenizer(texts + [solve_prompt(r["question"]) + join_steps(r["steps"])
                                   for r in generate("train", 50, 0, WORLD)], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    torch.manual_seed(0)
    enc = tok([t + tok.eos_token for t in texts], return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        model(**enc, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "world_config.json").write_text(json.dumps(asdict(WORLD)))
    return out


@pytest.fixture(scope="module")
def psv_dir(policy_dir, tmp_path_factory):
    from reward_models.psv import PSVVerifier, init_psv_from_policy

    out = tmp_path_factory.mktemp("psv")
    model, tok = init_psv_from_policy(str(policy_dir))
    PSVVerifier(model, tok).save_pretrained(str(out))
    return out


# ---------------------------------------------------------------------------------------------
# Metrics.


def test_metric_on_hand_computed_cases():
    m = processbench_metrics([1, -1, 2, -1], [1, 0, -1, -1])
    assert m == {"f1": 0.5, "acc_erroneous": 0.5, "acc_correct": 0.5, "n": 4, "n_erroneous": 2, "n_correct": 2}
    m = processbench_metrics([1, 2, -1], [1, 1, -1])
    assert m["acc_erroneous"] == 0.5 and m["acc_correct"] == 1.0 and m["f1"] == pytest.approx(2 / 3)
    m = processbench_metrics([-1, -1, -1], [0, 2, -1])  # never flags: perfect on correct, 0 on erroneous
    assert m["acc_erroneous"] == 0.0 and m["acc_correct"] == 1.0 and m["f1"] == 0.0
    m = processbench_metrics([0, 0], [-1, -1])  # both accuracies 0
    assert m["f1"] is None and m["acc_correct"] == 0.0 and m["acc_erroneous"] is None
    assert processbench_metrics([0, -1], [0, -1])["f1"] == 1.0
    m = processbench_metrics([2, 0], [1, -1])
    assert m["f1"] == 0.0 and m["acc_erroneous"] == 0.0 and m["acc_correct"] == 0.0
    with pytest.raises(ValueError):
        processbench_metrics([0], [0, 1])


def test_decision_rules():
    scores = [[0.9, 0.8, 0.3, 0.2], [0.9, 0.6, 0.35], [0.4], [0.95, 0.9]]
    assert earliest_error_predictions(scores, 0.5) == [2, 2, 0, -1]
    assert earliest_error_predictions(scores) == [2, 2, 0, -1]  # default threshold 0.5
    # drop: relative change from the previous score (1.0 before the first step) below -0.5
    assert earliest_error_predictions(scores, -0.5, rule="drop") == [2, -1, 0, -1]
    assert earliest_error_predictions([[0.0, 0.0]], -0.5, rule="drop") == [0]
    assert ev.rule_values([0.5, 0.25], "drop") == [-0.5, -0.5]
    with pytest.raises(ValueError):
        earliest_error_predictions(scores, 0.5, rule="nope")


def test_calibration_separates_a_toy_set_the_default_does_not():
    # correct paths score 0.2-0.3 everywhere; erroneous ones fall to 0.05-0.1 at the gold step
    scores = [[0.3, 0.25, 0.2], [0.22, 0.3], [0.3, 0.1, 0.05], [0.08, 0.05], [0.25, 0.28, 0.09]]
    gold = [-1, -1, 1, 0, 2]
    assert processbench_metrics(earliest_error_predictions(scores, 0.5), gold)["f1"] == 0.0
    threshold = calibrate_threshold(scores, gold)
    assert 0.1 < threshold <= 0.2
    assert processbench_metrics(earliest_error_predictions(scores, threshold), gold)["f1"] == 1.0
    assert calibrate_threshold(scores, gold, grid=[0.5, 0.15]) == 0.15
    drop = calibrate_threshold(scores, gold, rule="drop")
    f1_drop = processbench_metrics(earliest_error_predictions(scores, drop, "drop"), gold)["f1"]
    assert f1_drop >= processbench_metrics(earliest_error_predictions(scores, -0.5, "drop"), gold)["f1"]
    with pytest.raises(ValueError, match="both"):
        calibrate_threshold([[0.9]], [-1])


def test_best_of_n_on_toy_groups():
    groups = [
        # mean prefers the wrong path (0.65 > 0.6); min, prod and last prefer the right one
        [([1.0, 0.3], False), ([0.6, 0.6], True)],
        # every aggregation picks the right path
        [([0.9, 0.9], True), ([0.95, 0.2], False), ([0.1, 0.1], False)],
        # a tie between a right and a wrong path counts one half
        [([0.7], True), ([0.7], False)],
        # nothing right; one path could not be scored
        [([0.5], False), (None, False)],
    ]
    out = best_of_n_accuracy(groups)
    assert out["mean"] == pytest.approx((0 + 1 + 0.5 + 0) / 4)
    assert out["min"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert out["last"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert out["prod"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)  # 0.3 < 0.36
    assert out["oracle"] == 0.75
    assert out["random"] == pytest.approx((0.5 + 1 / 3 + 0.5 + 0) / 4)
    assert out["groups"] == 4 and out["n"] == 3
    assert set(best_of_n_accuracy(groups, "min")) >= {"min", "oracle", "random"}
    assert "mean" not in best_of_n_accuracy(groups, "min")


# ---------------------------------------------------------------------------------------------
# Verifier specs.


def test_load_verifier_specs(policy_dir, psv_dir, tmp_path):
    assert psv_dir_kind(psv_dir) == "full" and psv_dir_kind(policy_dir) == "policy"
    assert type(load_verifier(str(psv_dir))).__name__ == "PSVVerifier"
    assert type(load_verifier("confidence", str(policy_dir))).__name__ == "ConfidenceVerifier"
    rows = generate("test", 2, 0, WORLD)
    exact = load_verifier("exact", world_rows=rows)
    assert exact.score([rows[0]["question"]], [rows[0]["steps"]]) == [[1.0] * len(rows[0]["steps"])]
    with pytest.raises(ValueError, match="--policy"):
        load_verifier("confidence")
    with pytest.raises(ValueError, match="world"):
        load_verifier("exact", world_rows=[])
    with pytest.raises(ValueError, match="causal LM"):
        load_verifier(str(policy_dir))
    with pytest.raises(ValueError, match="no such directory"):
        load_verifier(str(tmp_path / "missing"))


def test_confidence_and_combined_specs(policy_dir, psv_dir):
    from reward_models.load import needs_policy, pin_policy, spec_parts

    step = load_verifier(f"step-confidence:{policy_dir}")
    assert type(step).__name__ == "ConfidenceVerifier" and step.span == "step"
    assert load_verifier("confidence", str(policy_dir)).span == "result"
    with pytest.raises(ValueError, match="step-confidence:PATH"):
        load_verifier("step-confidence")
    with pytest.raises(ValueError, match="not a causal-LM policy"):
        load_verifier(f"step-confidence:{psv_dir}")
    spec = f"product:step-confidence,{psv_dir}"
    assert spec_parts(spec) == ["step-confidence", str(psv_dir)]
    assert needs_policy(spec) and not needs_policy(f"min:step-confidence:{policy_dir},{psv_dir}")
    assert pin_policy(spec, "P") == f"product:step-confidence:P,{psv_dir}"
    assert pin_policy("confidence:Q", "P") == "confidence:Q" and pin_policy(str(psv_dir), "P") == str(psv_dir)
    joined = load_verifier(spec, str(policy_dir))
    rows = generate("test", 3, 0, WORLD)
    questions, paths = [r["question"] for r in rows], [r["steps"] for r in rows]
    parts = [p.score(questions, paths) for p in joined.parts]
    got = joined.score(questions, paths)
    assert got == [[a * b for a, b in zip(x, y)] for x, y in zip(*parts)]
    assert joined.tokens_used == sum(p.tokens_used for p in joined.parts) > 0
    for bad in ("product:step-confidence", "min:a,,b", f"min:product:a,b,{psv_dir}"):
        with pytest.raises(ValueError, match="product|min"):
            load_verifier(bad, str(policy_dir))


# ---------------------------------------------------------------------------------------------
# The CLI.


def run_cli(argv, capsys) -> dict:
    code = ev.main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


def processbench_rows():
    rows = generate("test", 6, 1, WORLD)
    out = []
    for i, r in enumerate(rows):
        steps = list(r["steps"])
        label = -1
        if i % 2:
            steps[0] = steps[0].replace(" = ", " = 1")  # a slip at the first step
            label = 0
        out.append({"id": f"pb-{i}", "question": r["question"], "answer": "", "steps": steps, "label": label,
                    "final_answer_correct": label == -1, "generator": "test"})
    out.append({"id": "pb-empty", "question": "Q?", "answer": "", "steps": ["a", ""], "label": 1})
    return out


def test_cli_on_a_processbench_file(psv_dir, tmp_path, capsys):
    data = tmp_path / "pb.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in processbench_rows()))
    out = run_cli(["--verifier", str(psv_dir), "--data", str(data), "--out", str(tmp_path / "rows.jsonl")], capsys)
    assert out["n"] == 6 and out["n_erroneous"] == 3 and out["n_correct"] == 3
    assert out["skipped"]["total"] == 1 and out["skipped"]["reasons"] == {"empty_step": 1}
    assert "step 1 is empty" in out["skipped"]["examples"]["empty_step"]
    assert out["threshold"] == 0.5 and out["rule"] == "threshold" and out["verifier"] == str(psv_dir)
    assert out["verifier_tokens"] > 0 and {"f1", "acc_erroneous", "acc_correct"} <= set(out)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and rows[-1]["skipped"] == "empty_step" and rows[-1]["scores"] is None
    assert all(len(r["scores"]) == len(r["steps"]) and r["pred"] in range(-1, len(r["steps"])) for r in rows[:6])
    calibrated = run_cli(["--verifier", str(psv_dir), "--data", str(data), "--calibrate-on", str(data),
                          "--rule", "drop"], capsys)
    assert calibrated["rule"] == "drop" and calibrated["calibration"]["n"] == 6
    assert calibrated["f1"] == calibrated["calibration"]["f1"]  # same data: same F1


def test_cli_on_stepwise_data_with_exact_labels(psv_dir, tmp_path, capsys):
    rows = [{"id": r["id"], "prompt": r["question"], "completions": r["steps"], "labels": [0.5] * len(r["steps"]),
             "exact_labels": [0 if (r["label"] >= 0 and k >= r["label"]) else 1 for k in range(len(r["steps"]))]}
            for r in processbench_rows()[:6]]
    rows[0] = {**rows[0], "earliest_error": 1}
    rows[2] = {**rows[2], "answer_correct": False}  # no wrong step, no right answer: excluded
    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_cli(["--verifier", str(psv_dir), "--data", str(data), "--threshold", "0.3"], capsys)
    assert out["kind"] == "stepwise" and out["n"] == 5 and out["n_erroneous"] == 4 and out["threshold"] == 0.3
    assert out["excluded_from_step_metric"] == {"missing_answer": 1}


def test_cli_reports_bad_data_with_file_and_line(psv_dir, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(processbench_rows()[0]) + "\n\n" + json.dumps({"id": "x", "steps": ["a"], "label": 5,
                                                                             "question": "q"}) + "\n")
    assert ev.main(["--verifier", str(psv_dir), "--data", str(data)]) == 2
    assert f"{data}:3: label = 5" in capsys.readouterr().err
    assert ev.main(["--verifier", "exact", "--data", str(data), "--threshold", "0.5", "--calibrate-on", "x"]) == 2
    assert "not both" in capsys.readouterr().err


def test_cli_on_shared_processbench(psv_dir, capsys):
    directory = default_data_dir()
    if directory is None or not (directory / "processbench_gsm8k.jsonl").is_file():
        pytest.skip("../shared/data/processbench_gsm8k.jsonl is not here (set STEPRL_DATA_DIR to use it)")
    out = run_cli(["--verifier", str(psv_dir), "--data", str(directory / "processbench_gsm8k.jsonl"),
                   "--limit", "20"], capsys)
    assert out["n"] + out["skipped"]["total"] == 20
    # the tiny model's context (1024 tokens) is shorter than some ProcessBench paths in its tokenizer
    assert set(out["skipped"]["reasons"]) <= {"too_long", "empty_step"}
    by_name = run_cli(["--verifier", str(psv_dir), "--data", "processbench_gsm8k", "--limit", "20"], capsys)
    assert by_name["n"] == out["n"] and by_name["f1"] == out["f1"]


def test_cli_world_with_policy_and_exact_verifier(policy_dir, tmp_path, capsys):
    out = run_cli(["--verifier", "exact", "--data", "world", "--policy", str(policy_dir), "--limit", "4",
                   "--samples_per_problem", "8", "--max_new_tokens", "64", "--out", str(tmp_path / "w.jsonl")],
                  capsys)
    assert out["kind"] == "world" and out["paths"] == 32
    assert out["n_erroneous"] > 0 and out["n_correct"] > 0
    assert out["f1"] == 1.0 and out["acc_erroneous"] == 1.0 and out["acc_correct"] == 1.0
    assert out["n"] + out["skipped"]["total"] + sum(out["excluded_from_step_metric"].values()) == 32
    bon = out["best_of_n"]
    assert bon["groups"] == 4 and bon["n"] == 8
    assert {"mean", "min", "prod", "last", "oracle", "random"} <= set(bon)
    assert bon["random"] <= bon["min"] <= bon["oracle"]  # the exact verifier never picks a wrong path over a right one
    rows = [json.loads(line) for line in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and all(r["problem_id"].startswith("world-test-0-") for r in rows)


def test_cli_world_file_with_confidence_and_calibration(policy_dir, tmp_path, capsys):
    world = tmp_path / "world.jsonl"
    world.write_text("".join(json.dumps(r) + "\n" for r in generate("test", 4, 0, WORLD)))
    out = run_cli(["--verifier", "confidence", "--policy", str(policy_dir), "--data", str(world),
                   "--calibrate-on", str(world), "--samples_per_problem", "4", "--bon_n", "4",
                   "--max_new_tokens", "64"], capsys)
    assert out["kind"] == "world" and out["calibration"]["data"] == str(world)
    assert out["verifier_tokens"] > 0 and out["best_of_n"]["n"] == 4
    assert ev.main(["--verifier", "exact", "--data", str(world)]) == 2
    assert "--policy" in capsys.readouterr().err


def test_cli_refuses_bad_input_before_the_expensive_work(policy_dir, psv_dir, tmp_path, capsys, monkeypatch):
    """A non-object `world`, `--out` naming a directory and a misspelt verifier: one line, exit 2,
    before any path is sampled or scored (these used to end in tracebacks, some after all the work)."""
    def no_sampling(*args, **kwargs):
        raise AssertionError("paths were sampled before the input was checked")

    monkeypatch.setattr(ev, "sample_world_paths", no_sampling)
    row = generate("test", 1, 0, WORLD)[0]
    world = tmp_path / "world.jsonl"
    for bad in ("oops", [1, 2], {"quantities": {}, "target": "x"}):
        world.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "w2", "world": bad}) + "\n")
        assert ev.main(["--verifier", "exact", "--data", str(world), "--policy", str(policy_dir)]) == 2
        err = capsys.readouterr().err
        assert f"{world}:2: not a world row" in err and err.count("\n") == 1
    pb = tmp_path / "pb.jsonl"
    pb.write_text("".join(json.dumps(r) + "\n" for r in processbench_rows()))
    assert ev.main(["--verifier", str(psv_dir), "--data", str(pb), "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    assert ev.main(["--verifier", str(psv_dir) + "x", "--data", "world", "--policy", str(policy_dir)]) == 2
    assert "no such directory" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# --limit on a file sorted by label, as ProcessBench's are


def sorted_processbench_file(tmp_path, labels):
    """A ProcessBench-format file whose rows are sorted by label (each row has 3 steps)."""
    rows = [{"id": f"pb-{i}", "question": f"Q{i}?", "answer": "", "steps": ["a = 1", "b = 2", "c = 3"], "label": label,
             "final_answer_correct": label == -1, "generator": "test"} for i, label in enumerate(labels)]
    data = tmp_path / "pb_sorted.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def limited(data, limit, **kw):
    args = ev.EvalArguments(verifier="exact", data=str(data), limit=limit, **kw)
    return ev.load_eval_set(str(data), args, None, "test", limit).items


def test_a_stratified_limit_keeps_both_kinds_of_path(tmp_path):
    labels = [0] * 4 + [1] * 2 + [2] * 2 + [-1] * 8
    data = sorted_processbench_file(tmp_path, labels)
    # first: the old behaviour, one label only
    assert [it.gold for it in limited(data, 4, limit_strategy="first")] == [0, 0, 0, 0]
    # stratified (the default): half correct, half erroneous as in the file; each label in proportion
    items = limited(data, 4)
    golds = sorted(it.gold for it in items)
    assert golds == [-1, -1, 0, 1]
    ids = [it.id for it in items]
    assert ids == sorted(ids, key=lambda i: int(i.split("-")[1]))  # kept in file order
    assert [it.id for it in limited(data, 4)] == ids  # deterministic given the seed
    draws = {tuple(it.id for it in limited(data, 4, seed=s)) for s in range(6)}
    assert len(draws) > 1  # the seed draws the rows within each label
    assert all(sorted(int(i.split("-")[1]) >= 8 for i in d) == [False, False, True, True] for d in draws)
    eight = sorted(it.gold for it in limited(data, 8))
    assert eight == [-1] * 4 + [0, 0, 1, 2]
    # spread: evenly spaced rows
    assert [it.id for it in limited(data, 4, limit_strategy="spread")] == ["pb-0", "pb-4", "pb-8", "pb-12"]
    # a limit beyond the file keeps every row, whatever the strategy
    assert len(limited(data, 100)) == len(limited(data, 100, limit_strategy="first")) == 16


def test_a_stratified_limit_keeps_a_rare_kind(tmp_path):
    data = sorted_processbench_file(tmp_path, [1] * 15 + [-1])
    assert sorted(it.gold for it in limited(data, 2)) == [-1, 1]
    assert [it.gold for it in limited(data, 1)] == [1]  # one row: the larger share
    assert ev.limited_rows([None] * 10, 3, seed=0) == ev.limited_rows([None] * 10, 3, seed=0)
    assert len(ev.limited_rows([None] * 10, 3)) == 3  # unlabelled rows (a world file): a seeded draw


def test_limit_strategy_is_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="--limit_strategy must be one of stratified, spread, first; got 'top'"):
        ev.EvalArguments(verifier="exact", data="x", limit_strategy="top")
    with pytest.raises(ValueError, match="--limit must be >= 0"):
        ev.EvalArguments(verifier="exact", data="x", limit=-1)
    with pytest.raises(SystemExit) as stop:  # argparse's choices: usage and one error line, exit 2
        ev.main(["--verifier", "exact", "--data", "x", "--limit_strategy", "top"])
    assert stop.value.code == 2 and "invalid choice: 'top'" in capsys.readouterr().err
