"""Process annotation (reward_models/annotate/): labelling rules, each method, resuming, bad input."""

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from backends.base import Completion
from reasoning.steps import split_steps
from reasoning.world import earliest_error, generate, row_to_problem
from reward_models import annotate as ann
from reward_models.annotate import AnnotateConfig, TreeNode, autopsv_labels, mc_label, tree_paths

WRONG_STEP = "Zed has 1 + 1 = 2 cups."
ROW_KEYS = {"id", "problem_id", "prompt", "completions", "labels", "method", "answer_correct", "exact_labels"}


# ----------------------------------------------------------------------------------------------
# pure labelling rules


def leaf(step, correct=False):
    return TreeNode(step, correct=correct, status="answer")


def test_tree_labels_are_leaf_fractions():
    # root -> a -> {a1 (right), a2 (wrong)}; root -> b -> {b1 -> {b11 (right), b12 (right)}, b2 (wrong)}
    b1 = TreeNode("b1", [leaf("b11", True), leaf("b12", True)])
    root = TreeNode(None, [TreeNode("a", [leaf("a1", True), leaf("a2")]), TreeNode("b", [b1, leaf("b2")])])
    paths = tree_paths(root)
    assert [steps for steps, _, _ in paths] == [
        ["a", "a1"], ["a", "a2"], ["b", "b1", "b11"], ["b", "b1", "b12"], ["b", "b2"]]
    labels = {tuple(steps): labels for steps, labels, _ in paths}
    assert labels[("a", "a1")] == [0.5, 1.0]
    assert labels[("a", "a2")] == [0.5, 0.0]
    assert labels[("b", "b1", "b11")] == [pytest.approx(2 / 3), 1.0, 1.0]
    assert labels[("b", "b2")] == [pytest.approx(2 / 3), 0.0]
    # a parent's label is the leaf-weighted mean of its children's: b = (2 * 1.0 + 1 * 0.0) / 3
    assert [leaf.correct for _, _, leaf in paths] == [True, False, True, True, False]


def test_tree_labels_edge_cases():
    assert tree_paths(TreeNode(None)) == []  # no continuation at all: no path
    dead = TreeNode("x", status="dead_end")  # a step whose continuations were all empty: a wrong leaf
    ((steps, labels, _),) = tree_paths(TreeNode(None, [dead]))
    assert steps == ["x"] and labels == [0.0]


def test_autopsv_relative_drop_rule():
    # baseline 0.5: 0.6 (+20%) ok, 0.2 (-67%) wrong, and everything after stays wrong
    assert autopsv_labels([0.6, 0.2, 0.9], baseline=0.5) == [1.0, 0.0, 0.0]
    # exactly -50% is not below the threshold; -60% is
    assert autopsv_labels([0.25, 0.1], baseline=0.5) == [1.0, 0.0]
    # the first step is compared with the baseline
    assert autopsv_labels([0.2, 0.3], baseline=0.5) == [0.0, 0.0]
    assert autopsv_labels([0.2, 0.3], baseline=0.3) == [1.0, 1.0]
    # a previous score of 0 cannot drop further; a custom threshold
    assert autopsv_labels([0.0, 0.0, 0.5], baseline=0.0) == [1.0, 1.0, 1.0]
    assert autopsv_labels([0.4, 0.3], baseline=0.5, threshold=-0.2) == [1.0, 0.0]
    assert autopsv_labels([], baseline=0.5) == []
    # each step is compared with the step before it, not with the baseline
    assert autopsv_labels([0.9, 0.4], baseline=0.5) == [1.0, 0.0]
    assert autopsv_labels([0.2, 0.12], baseline=0.3) == [1.0, 1.0]


def test_mc_label():
    assert mc_label([True, False, False, False]) == 0.25
    assert mc_label([True, False, False, False], hard=True) == 1.0
    assert mc_label([False, False], hard=True) == 0.0
    with pytest.raises(ValueError):
        mc_label([])
    # Best-of-K: one right of four continuations, K = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6
    assert mc_label([True, False, False, False], best_of=2) == pytest.approx(0.5)
    assert mc_label([True, False, False, False], best_of=4) == 1.0  # every 4-subset holds the right one
    assert mc_label([False] * 4, best_of=3) == 0.0 and mc_label([True] * 4, best_of=3) == 1.0
    assert mc_label([True, False], best_of=3) == pytest.approx(1 - 0.5**3)  # fewer rollouts than K: plug-in


# ----------------------------------------------------------------------------------------------
# each method on a scripted generator whose steps are known to be right or wrong


class ScriptedGenerator:
    """Continues world problems by rule: the gold step from a right prefix (solve prompt), a fixed
    wrong step (exploratory prompt, or every odd full path), a wrong answer after a wrong prefix."""

    def __init__(self, rows, explore_is_gold=False):
        self.rows = {r["question"]: r for r in rows}
        self.explore_is_gold = explore_is_gold
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for prompt in prompts:
            m = re.match(r"Question: (.*)\nAnswer( \(exploratory, may contain mistakes\))?:\n(.*)\Z", prompt, re.S)
            gold = self.rows[m.group(1)]["steps"]
            prefix = split_steps(m.group(3)).steps
            right = prefix == gold[: len(prefix)]
            texts = []
            for j in range(params.n):
                if params.stop:  # one step
                    if right:
                        wrong = m.group(2) and not self.explore_is_gold
                        steps = [WRONG_STEP] if wrong else [gold[len(prefix)]]
                    else:
                        steps = [f"The answer is <ans>-{1 if m.group(2) else 2}</ans>."]
                elif right and j % 2 == 0:
                    steps = gold[len(prefix):]
                elif right:
                    steps = [WRONG_STEP, "The answer is <ans>-1</ans>."]
                else:
                    steps = ["The answer is <ans>-1</ans>."]
                texts.append("\n".join(f"<Step> {s}</Step>" for s in steps))
            out.append([Completion(t, len(prompt), len(t.split()), "stop") for t in texts])
        return out


@pytest.fixture(scope="module")
def world_rows():
    return generate("train", 3, 0)


def config(tmp_path, method, **kw):
    return AnnotateConfig(method=method, policy="unused", out=str(tmp_path / f"{method}.jsonl"),
                          disable_tqdm=True, **kw)


def read_rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def check_schema(rows, method):
    for row in rows:
        assert ROW_KEYS <= set(row) and row["method"] == method
        assert row["id"].startswith(f"{row['problem_id']}/{method}/")
        assert len(row["completions"]) == len(row["labels"]) == len(row["exact_labels"]) >= 1
        assert all(isinstance(s, str) and s.strip() for s in row["completions"])
        assert all(isinstance(y, float) and 0.0 <= y <= 1.0 for y in row["labels"])
        assert isinstance(row["answer_correct"], bool)
    assert len({r["id"] for r in rows}) == len(rows)


def test_tree_on_scripted_policy(tmp_path, world_rows):
    problems = [row_to_problem(r) for r in world_rows]
    summary = ann.annotate(config(tmp_path, "tree", batch_size=2), ScriptedGenerator(world_rows), problems)
    rows = read_rows(tmp_path / "tree.jsonl")
    check_schema(rows, "tree")
    for r in world_rows:
        gold = r["steps"]
        mine = [x for x in rows if x["problem_id"] == r["id"]]
        # every right step k has a wrong sibling with two wrong leaves: 1 right leaf of 1 + 2 (L-1-k)
        (right,) = [x for x in mine if x["answer_correct"]]
        assert right["completions"] == gold
        L = len(gold)
        assert right["labels"] == pytest.approx([1 / (1 + 2 * (L - 1 - k)) for k in range(L)])
        assert len(mine) == 1 + 2 * (L - 1) + 2
        for x in mine:
            if WRONG_STEP in x["completions"]:
                k = x["completions"].index(WRONG_STEP)
                assert x["labels"][k:] == [0.0, 0.0] and x["exact_labels"][k:] == [0.0, 0.0]
    assert summary["counts"]["leaf_answer"] == len(rows)
    assert summary["agreement"]["steps"] == summary["steps"]


def test_tree_merges_identical_siblings(tmp_path, world_rows):
    problems = [row_to_problem(r) for r in world_rows]
    gen = ScriptedGenerator(world_rows, explore_is_gold=True)
    summary = ann.annotate(config(tmp_path, "tree"), gen, problems)
    rows = read_rows(tmp_path / "tree.jsonl")
    # both prompts write the gold step at every node: one chain per problem
    assert [r["completions"] for r in rows] == [r["steps"] for r in world_rows]
    assert all(r["labels"] == [1.0] * len(r["labels"]) for r in rows)
    assert summary["counts"]["duplicate_steps_merged"] == sum(len(r["steps"]) for r in world_rows)


def test_tree_depth_cap(tmp_path, world_rows):
    problems = [row_to_problem(r) for r in world_rows]
    summary = ann.annotate(config(tmp_path, "tree", max_depth=1), ScriptedGenerator(world_rows), problems)
    rows = read_rows(tmp_path / "tree.jsonl")
    # depth 1: the gold first step and the wrong step, both capped without an answer
    assert all(len(r["completions"]) == 1 and r["labels"] == [0.0] for r in rows)
    assert len(rows) == 2 * len(problems) and summary["bad_generations"]["leaf_capped"] == len(rows)


@pytest.mark.parametrize("hard", [False, True])
def test_mc_on_scripted_policy(tmp_path, world_rows, hard):
    problems = [row_to_problem(r) for r in world_rows]
    gen = ScriptedGenerator(world_rows)
    ann.annotate(config(tmp_path, "mc", paths_per_problem=4, rollouts=4, hard=hard), gen, problems)
    rows = read_rows(tmp_path / "mc.jsonl")
    check_schema(rows, "mc")
    assert len(rows) == 4 * len(problems) and gen.calls == 2  # paths, then all rollouts in one call
    for row in rows:
        if row["answer_correct"]:  # the gold path: half the rollouts from each prefix reach the answer
            assert row["labels"] == [1.0 if hard else 0.5] * (len(row["labels"]) - 1) + [1.0]
            assert row["exact_labels"] == [1.0] * len(row["labels"])
        else:
            assert row["completions"][0] == WRONG_STEP and row["labels"] == [0.0, 0.0]


def test_mc_best_of_k_labels_are_the_provers_pass_at_k_and_old_files_resume(tmp_path, world_rows):
    """--best_of 2: half of the four rollouts from each gold prefix are right, so a prefix's label is
    1 - C(2, 2) / C(4, 2) = 5/6; the last step keeps the path's own check; the setting is recorded
    only when it is not 1, so files labelled before it existed resume."""
    problems = [row_to_problem(r) for r in world_rows]
    ann.annotate(config(tmp_path, "mc", paths_per_problem=4, rollouts=4, best_of=2), ScriptedGenerator(world_rows),
                 problems)
    rows = read_rows(tmp_path / "mc.jsonl")
    gold = [r for r in rows if r["answer_correct"]]
    assert gold and all(r["labels"] == pytest.approx([5 / 6] * (len(r["labels"]) - 1) + [1.0]) for r in gold)
    assert all(r["labels"] == [0.0, 0.0] for r in rows if not r["answer_correct"])
    assert json.loads((tmp_path / "mc.jsonl.meta.json").read_text())["best_of"] == 2
    assert "best_of" not in config(tmp_path, "mc").settings()


@pytest.mark.parametrize(("kw", "message"), [({"best_of": 0}, "best_of must be >= 1"),
                                             ({"best_of": 2, "hard": True}, "give one"),
                                             ({"best_of": 2, "method": "tree"}, "mc rollouts only")])
def test_best_of_refusals(tmp_path, kw, message):
    kw = {"method": "mc", **kw}
    with pytest.raises(ann.AnnotationError, match=message):
        ann.annotate(config(tmp_path, **kw), ScriptedGenerator([]), [])


def test_exact_and_autopsv_on_scripted_policy(tmp_path):
    problems = [row_to_problem(r) for r in generate("train", 4, 1)]
    gen = ScriptedGenerator(generate("train", 4, 1))
    summary = ann.annotate(config(tmp_path, "exact", paths_per_problem=2), gen, problems)
    rows = read_rows(tmp_path / "exact.jsonl")
    check_schema(rows, "exact")
    assert summary["agreement"] == {"steps": summary["steps"], "mae": 0.0, "accuracy": 1.0}
    trained = []

    def fake_train(rows, init_from, output_dir, **kw):
        assert kw["outcome_only"] is True and all(len(set(r["labels"])) == 1 for r in rows)
        trained.append(rows)
        (Path(output_dir) / "model.txt").write_text("orm")
        return output_dir

    class FakeORM:  # 0.9 for a gold step, 0.1 for the wrong one: baseline = (0.9 + 0.1) / 2
        def score(self, questions, paths):
            return [[0.1 if s == WRONG_STEP else 0.9 for s in p] for p in paths]

    cfg = config(tmp_path, "autopsv", paths_per_problem=2)
    summary = ann.annotate(cfg, gen, problems, train_fn=fake_train, verifier_factory=lambda path: FakeORM())
    rows = read_rows(tmp_path / "autopsv.jsonl")
    assert len(trained) == 1 and summary["orm"]["baseline"] == pytest.approx(0.5)
    assert summary["orm"]["train_problems"] == 2 and summary["problems"] == 2
    train_ids = {r["problem_id"] for r in trained[0]}
    assert train_ids.isdisjoint(r["problem_id"] for r in rows) and len(rows) == 4
    for row in rows:
        assert row["labels"] == row["exact_labels"]  # the ORM separates the two kinds of step here
        assert row["labels"] == ([1.0] * len(row["labels"]) if row["answer_correct"] else [0.0, 0.0])
    # the ORM directory is reused: no second training
    Path(cfg.out).unlink()
    Path(cfg.out + ".done").unlink()
    ann.annotate(cfg, gen, problems, train_fn=fake_train, verifier_factory=lambda path: FakeORM())
    assert len(trained) == 1 and read_rows(cfg.out) == rows


# ----------------------------------------------------------------------------------------------
# the CLI with a tiny policy trained offline


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from rl import sft

    out = tmp_path_factory.mktemp("annotate") / "policy"
    code = sft.main([
        # 60 steps: enough for the policy to close some steps with </Step>, so trees branch
        "--output_dir", str(out), "--n_train", "256", "--n_eval", "4", "--max_steps", "60", "--learning_rate",
        "5e-3", "--per_device_train_batch_size", "16", "--hidden_size", "32", "--num_layers", "1", "--num_heads",
        "2", "--vocab_size", "300", "--max_new_tokens", "24", "--disable_tqdm", "true", "--report_to", "none",
    ])
    assert code == 0
    return str(out)


def run_cli(policy, out, method, *extra):
    args = ["--method", method, "--policy", policy, "--n", "3", "--seed", "0", "--out", str(out),
            "--disable_tqdm", "true", "--max_new_tokens", "24", "--step_max_new_tokens", "24",
            "--batch_size", "2", *extra]
    return ann.main(args)


def check_tree_consistency(rows):
    """Each label = the fraction of right leaves below; a parent's = the leaf-weighted mean of its children's."""
    by_problem = defaultdict(list)
    for row in rows:
        by_problem[row["problem_id"]].append(row)
    for prows in by_problem.values():
        leaves, right, label = defaultdict(int), defaultdict(int), {}
        for row in prows:
            steps = row["completions"]
            for k in range(len(steps)):
                prefix = tuple(steps[: k + 1])
                leaves[prefix] += 1
                right[prefix] += row["answer_correct"]
                assert label.setdefault(prefix, row["labels"][k]) == row["labels"][k]
        for prefix in leaves:
            assert label[prefix] == pytest.approx(right[prefix] / leaves[prefix])
            children = [c for c in leaves if len(c) == len(prefix) + 1 and c[:-1] == prefix]
            if children:
                mean = sum(leaves[c] * label[c] for c in children) / sum(leaves[c] for c in children)
                assert label[prefix] == pytest.approx(mean) and len(children) <= 2


@pytest.mark.slow
def test_cli_methods_with_tiny_policy(policy, tmp_path, capsys):
    problems = {r["id"]: r for r in generate("train", 3, 0)}
    outputs = {}
    for method, extra in (("tree", ("--max_depth", "3")), ("mc", ("--paths_per_problem", "2", "--rollouts", "2")),
                          ("exact", ("--paths_per_problem", "2"))):
        out = tmp_path / f"{method}.jsonl"
        assert run_cli(policy, out, method, *extra) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        rows = read_rows(out)
        check_schema(rows, method)
        assert summary["rows"] == len(rows) and summary["problems"] == 3
        assert {"steps", "mean_label", "generated_tokens", "seconds", "bad_generations", "agreement"} <= set(summary)
        assert summary["generated_tokens"] > 0
        for row in rows:
            assert row["exact_labels"] == ann.exact_labels(problems[row["problem_id"]], row["completions"])
            first_wrong = earliest_error(problems[row["problem_id"]], row["completions"])
            assert row["answer_correct"] <= (first_wrong == -1)
        outputs[method] = rows
    check_tree_consistency(outputs["tree"])
    assert max(len(r["completions"]) for r in outputs["tree"]) > 1  # the trees branch below the root
    assert all(len(r["completions"]) <= 3 for r in outputs["tree"])
    for row in outputs["mc"]:
        assert row["labels"][-1] == float(row["answer_correct"])
    for row in outputs["exact"]:
        assert row["labels"] == row["exact_labels"]


@pytest.mark.slow
def test_cli_autopsv_with_tiny_policy(policy, tmp_path, capsys):
    out = tmp_path / "autopsv.jsonl"
    extra = ("--paths_per_problem", "2", "--orm_max_steps", "2", "--orm_batch_size", "4")
    assert run_cli(policy, out, "autopsv", *extra) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = read_rows(out)
    check_schema(rows, "autopsv")
    info = json.loads((tmp_path / "autopsv.jsonl.orm" / "autopsv.json").read_text())
    assert 0.0 <= info["baseline"] <= 1.0 and len(info["train_problem_ids"]) == 2  # round(0.5 * 3)
    assert not set(info["train_problem_ids"]) & {r["problem_id"] for r in rows}
    for row in rows:
        assert row["labels"] == autopsv_labels(row["orm_scores"], info["baseline"], -0.5)
    assert summary["orm"]["reused"] is False and summary["problems"] == 1


@pytest.mark.slow
def test_resume_after_kill(policy, tmp_path, capsys):
    clean = tmp_path / "clean.jsonl"
    assert run_cli(policy, clean, "tree", "--max_depth", "3") == 0
    clean_rows = read_rows(clean)
    last = clean_rows[-1]["problem_id"]
    assert len({r["problem_id"] for r in clean_rows}) == 3

    # killed mid-write: the last problem's rows cut in the middle of a line, its done entry missing
    out = tmp_path / "killed.jsonl"
    text = clean.read_text()
    cut = text.index(f'"problem_id": "{last}"')
    out.write_text(text[:cut])
    done = [line for line in (tmp_path / "clean.jsonl.done").read_text().splitlines() if last not in line]
    (tmp_path / "killed.jsonl.done").write_text("\n".join(done) + "\n")
    (tmp_path / "killed.jsonl.meta.json").write_text((tmp_path / "clean.jsonl.meta.json").read_text())
    capsys.readouterr()
    assert run_cli(policy, out, "tree", "--max_depth", "3") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = read_rows(out)
    assert len({r["id"] for r in rows}) == len(rows)
    assert sorted(map(json.dumps, rows)) == sorted(map(json.dumps, clean_rows))
    assert summary["problems_resumed"] == 2 and summary["problems_annotated"] == 1
    assert summary["dropped_on_resume"]["partial_lines"] == 1

    # rows all written but the done entry lost: they are dropped and written again, once
    out.write_text(clean.read_text())
    (tmp_path / "killed.jsonl.done").write_text("\n".join(done) + "\n")
    assert run_cli(policy, out, "tree", "--max_depth", "3") == 0
    assert sorted(map(json.dumps, read_rows(out))) == sorted(map(json.dumps, clean_rows))

    # a done entry whose rows are not all there (a damaged file): the problem is annotated again
    lines = clean.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]))
    (tmp_path / "killed.jsonl.done").write_text((tmp_path / "clean.jsonl.done").read_text())
    assert run_cli(policy, out, "tree", "--max_depth", "3") == 0
    assert sorted(map(json.dumps, read_rows(out))) == sorted(map(json.dumps, clean_rows))

    # a finished output: nothing to do; other settings are refused
    capsys.readouterr()
    assert run_cli(policy, out, "tree", "--max_depth", "3") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["generated_tokens"] == 0 and summary["problems_resumed"] == 3
    assert run_cli(policy, out, "tree", "--max_depth", "2") == 2
    assert "max_depth" in capsys.readouterr().err


def test_malformed_data_file_names_file_and_line(tmp_path, capsys):
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "Ava has 2 cards. How many?", "answer": "2"}) + "\n"
                    + json.dumps({"id": "b", "question": "How many?"}) + "\n")
    code = ann.main(["--method", "mc", "--policy", str(tmp_path / "none"), "--data", str(data),
                     "--out", str(tmp_path / "a.jsonl"), "--disable_tqdm", "true"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err and "answer" in err


def test_bad_settings_and_inputs(tmp_path, capsys):
    code = ann.main(["--method", "exact", "--policy", "p", "--data", str(tmp_path / "missing.jsonl"),
                     "--out", str(tmp_path / "a.jsonl")])
    assert code == 2 and "missing.jsonl" in capsys.readouterr().err
    with pytest.raises(ann.AnnotationError, match="max_depth"):
        ann.annotate(config(tmp_path, "tree", max_depth=0), ScriptedGenerator([]), [])
    problem = row_to_problem(generate("train", 1, 0)[0])
    problem.meta.pop("world")
    with pytest.raises(ann.AnnotationError, match="world"):
        ann.annotate(config(tmp_path, "exact"), ScriptedGenerator([]), [problem])


def test_each_method_is_one_module_with_one_signature():
    """Every annotation method is a module of reward_models.annotate with an `annotate_group` of the
    same parameters; AutoPSV's, made once its outcome verifier is there, has them too."""
    import importlib
    import inspect

    expected = ["generator", "problems", "cfg", "group", "stats"]
    for method in ann.METHODS:
        module = importlib.import_module(f"reward_models.annotate.{method}")
        group_fn = module.make_annotator(None, None) if method == "autopsv" else module.annotate_group
        assert list(inspect.signature(group_fn).parameters) == expected, method
    from reward_models.annotate.run import ANNOTATORS

    assert set(ANNOTATORS) | {"autopsv"} == set(ann.METHODS)


class TrailingNumberGenerator:
    """Every path ends on the gold number without stating it as the answer (no <ans>, no 'answer is')."""

    def __init__(self, problems):
        self.answers = {p.question: p.answer for p in problems}

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            answer = next(a for q, a in self.answers.items() if q in prompt)
            text = f"<Step> First we add.</Step>\n<Step> So it is {answer}</Step>"
            out.append([Completion(text, 3, 5, "stop")] * params.n)
        return out


@pytest.mark.parametrize("match", ["strict", "flexible"])
def test_answer_match_decides_the_labels(tmp_path, world_rows, match):
    problems = [row_to_problem(r) for r in world_rows]
    cfg = config(tmp_path, "outcome", paths_per_problem=2, answer_match=match)
    ann.annotate(cfg, TrailingNumberGenerator(problems), problems)
    rows = read_rows(tmp_path / "outcome.jsonl")
    right = match == "flexible"  # a trailing number counts only under the flexible check
    assert len(rows) == 2 * len(problems) and all(r["answer_correct"] is right for r in rows)
    assert all(r["labels"] == [float(right)] * 2 for r in rows)
    meta = json.loads((tmp_path / "outcome.jsonl.meta.json").read_text())
    assert ("answer_match" in json.dumps(meta)) is right  # recorded when not the default, so old files resume


@pytest.mark.slow
def test_a_psv_on_best_of_k_mc_labels_pays_a_ppo_update_as_the_step_reward(policy, tmp_path, capsys):
    """The progress PSV a user keeps (issue 53, item 3): mc labels under a Best-of-2 prover, a PSV
    trained on them, and PPO paid by it as `--reward step`, whose default form pays each step the
    change of the PSV's score across it: PAV's progress, with no continuation sampled during RL."""
    from reward_models import train as psv_train
    from rl import ppo_step

    data, psv, out = tmp_path / "mc.jsonl", tmp_path / "psv", tmp_path / "ppo"
    assert run_cli(policy, data, "mc", "--paths_per_problem", "2", "--rollouts", "2", "--best_of", "2") == 0
    assert json.loads((tmp_path / "mc.jsonl.meta.json").read_text())["best_of"] == 2
    assert psv_train.main(["--data", str(data), "--init_from", policy, "--output_dir", str(psv), "--max_steps", "2",
                           "--disable_tqdm", "true"]) == 0
    capsys.readouterr()
    assert ppo_step.main(["--reward", "step", "--verifier", str(psv), "--model_name_or_path", policy,
                          "--output_dir", str(out), "--build_missing", "false", "--max_steps", "1",
                          "--prompts_per_update", "4", "--num_generations", "2", "--n_prompts", "8", "--n_eval", "4",
                          "--max_completion_length", "24", "--disable_tqdm", "true", "--num_threads", "1",
                          "--n_probe", "0"]) == 0
    run = json.loads((out / "run_config.json").read_text())
    flat = json.dumps(run)
    assert '"reward_shaping": "delta"' in flat and '"step_credit": "own"' in flat, flat[:2000]
    update = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert update["rollout/tokens"] > 0 and "reward/verifier_mean" in update, sorted(update)
