"""The one problem loader (reasoning/problem_sets.py): formats, schemas, gold answers, splits and
the train/evaluation overlap check, and its use by PPO, annotation and evaluation."""

import json

import pytest

from reasoning.benchmarks import DatasetError, load_jsonl_problems
from reasoning.problem_sets import (
    ProblemSet,
    check_disjoint,
    check_training_split,
    gold_answer,
    load_problem_set,
    split_of_name,
)
from reasoning.steps import answer_correct

GSM8K_ROWS = [  # the Hub's GSM8K schema: no id, the solution with "#### N" as the answer
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A box holds 1,000 pens and 80 more. How many pens?",
     "answer": "1000 + 80 = <<1000+80=1080>>1080\n#### 1,080"},
    {"question": "Sara reads 5 pages a day for 2 days. How many pages?", "answer": "5 * 2 = 10\n#### 10"},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_solution_is_reduced_to_its_answer_so_the_gold_reward_can_pay(tmp_path):
    """The Hub's GSM8K rows keep '... #### 7' as the answer: unreduced, no response ever matched it."""
    problems = load_problem_set(str(_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K_ROWS)), role="train").problems
    assert [p.answer for p in problems] == ["7", "1080", "10"]
    assert [p.answer_kind for p in problems] == ["number"] * 3
    assert [p.id for p in problems] == ["gsm8k_train-0", "gsm8k_train-1", "gsm8k_train-2"]  # made, no id column
    assert answer_correct("3 + 4 = 7. The answer is 7.", problems[0])
    assert answer_correct("The answer is 1080.", problems[1])
    # the strict reader of the home schema reduces it too
    rows = [{"id": f"g{i}", **r} for i, r in enumerate(GSM8K_ROWS)]
    assert [p.answer for p in load_jsonl_problems(_jsonl(tmp_path / "own.jsonl", rows))] == ["7", "1080", "10"]


def test_gold_answer_reduces_gsm8k_and_boxed_solutions():
    assert gold_answer("so 2 + 2 = 4\n#### 4") == "4"
    assert gold_answer("#### 1,234") == "1234"
    assert gold_answer("Hence $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert gold_answer("We get \\boxed{x^{2}} and so on") == "x^{2}"
    assert gold_answer(" 42 ") == "42" and gold_answer(7) == "7" and gold_answer(2.5) == "2.5"
    with pytest.raises(ValueError):
        gold_answer(None)


def test_every_file_format_and_common_schema_loads(tmp_path):
    datasets = pytest.importorskip("datasets")
    math_rows = [{"problem": "What is $1/2 + 0$?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"}]
    data = datasets.Dataset.from_list(math_rows)
    data.to_parquet(str(tmp_path / "math.parquet"))
    data.to_csv(str(tmp_path / "math.csv"), index=False)
    data.to_json(str(tmp_path / "math.json"))
    data.save_to_disk(str(tmp_path / "math_disk"))
    datasets.DatasetDict({"train": data, "test": datasets.Dataset.from_list(
        [{"problem": "Other?", "solution": "\\boxed{3}"}])}).save_to_disk(str(tmp_path / "math_dict"))
    for name in ("math.parquet", "math.csv", "math.json", "math_disk", "math_dict"):
        loaded = load_problem_set(str(tmp_path / name), role="train")
        (p,) = loaded.problems
        assert (p.question, p.answer, p.answer_kind) == ("What is $1/2 + 0$?", "\\frac{1}{2}", "latex"), name
        assert p.meta["level"] == "Level 1" and p.id.endswith("-0"), name
    test_part = load_problem_set(str(tmp_path / "math_dict"), role="eval")
    assert [p.answer for p in test_part.problems] == ["3"] and test_part.split == "test"
    assert load_problem_set(f"{tmp_path / 'math_dict'}:train").split == "train"
    with pytest.raises(DatasetError, match="no split 'dev'"):
        load_problem_set(f"{tmp_path / 'math_dict'}:dev")

    conversational = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}],
                       "completion": [{"role": "assistant", "content": "2+3=5\n#### 5"}]},
                      {"prompt": "4+4?", "completion": "8"}]
    loaded = load_problem_set(str(_jsonl(tmp_path / "pc.jsonl", conversational)))
    assert [(p.question, p.answer) for p in loaded.problems] == [("2+3?", "5"), ("4+4?", "8")]

    # MATH-500's schema keeps the short `answer` over the long `solution`
    both = [{"problem": "x?", "solution": "long \\boxed{2}", "answer": "2", "unique_id": "test/a/1.json"}]
    (p,) = load_problem_set(str(_jsonl(tmp_path / "m500.jsonl", both))).problems
    assert (p.id, p.answer, p.meta["solution"]) == ("test/a/1.json", "2", "long \\boxed{2}")


def test_column_mapping_and_its_errors(tmp_path):
    rows = [{"q_text": "1+1?", "gold": "#### 2", "other": "x"}]
    path = _jsonl(tmp_path / "custom.jsonl", rows)
    with pytest.raises(DatasetError, match=r"custom\.jsonl:1: no question column .*--question_column"):
        load_problem_set(str(path))
    (p,) = load_problem_set(str(path), question_column="q_text", answer_column="gold").problems
    assert (p.question, p.answer, p.meta) == ("1+1?", "2", {"other": "x"})
    with pytest.raises(DatasetError, match=r"no column 'nope' \(--answer_column\); columns: q_text, gold, other"):
        load_problem_set(str(path), question_column="q_text", answer_column="nope")


def test_unknown_sources_and_a_missing_benchmark_offline_are_one_line_errors(tmp_path, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError, match=r"benchmark 'gsm8k': no gsm8k_test\.jsonl in .*could not be loaded "
                                           r"\(ConnectionError\)"):
        load_problem_set("gsm8k", data_dir=tmp_path)
    with pytest.raises(DatasetError, match="the Hub is offline"):
        load_problem_set("someone/some-dataset:train")
    with pytest.raises(DatasetError, match="no such file"):
        load_problem_set(str(tmp_path / "absent.parquet"))
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(DatasetError, match="unknown file type '.txt'"):
        load_problem_set(str(tmp_path / "rows.txt"))


def test_benchmark_names_as_users_write_them(tmp_path):
    (tmp_path / "math500_test.jsonl").write_text(json.dumps({"id": "a", "question": "q", "answer": "1"}) + "\n")
    for name in ("math500", "MATH-500", "math_500"):
        loaded = load_problem_set(name, data_dir=tmp_path)
        assert [p.answer_kind for p in loaded.problems] == ["latex"] and loaded.split == "test", name


def test_splits_are_told_by_name_and_a_test_split_is_not_training_data(tmp_path):
    assert split_of_name("gsm8k_test.jsonl") == "test" and split_of_name("test-00000-of-00001.parquet") == "test"
    assert split_of_name("x/train.csv") == "train" and split_of_name("tests/test_a0/problems.jsonl") is None
    test_file = _jsonl(tmp_path / "gsm8k_test.jsonl", [{"id": "a", **GSM8K_ROWS[0]}])
    loaded = load_problem_set(str(test_file), role="train")
    with pytest.raises(DatasetError, match=r"--dataset .*gsm8k_test\.jsonl: is a test split.*--allow_test_split"):
        check_training_split(loaded, "--dataset", allow_test_split=False)
    check_training_split(loaded, "--dataset", allow_test_split=True)
    world = load_problem_set("world")
    assert world.split == "test" and world.world_rows
    with pytest.raises(DatasetError, match="is a test split"):
        check_training_split(world, "--data", allow_test_split=False)


def test_overlap_is_counted_on_normalised_questions():
    from reasoning.types import Problem

    def problems(*questions):
        return [Problem(id=str(i), question=q, answer="1") for i, q in enumerate(questions)]

    train = ProblemSet("train.jsonl", problems("How many apples?", "Two plus two?"), "train")
    evaluation = ProblemSet("eval.jsonl", problems("how  many APPLES?", "Other?", "Two plus two?"), "test")
    with pytest.raises(DatasetError) as info:
        check_disjoint(train, evaluation)
    assert str(info.value) == ("--dataset train.jsonl and --eval_dataset eval.jsonl share 2 of 3 evaluation "
                               "questions: evaluate on problems the run does not train on")
    check_disjoint(train, ProblemSet("e", problems("Other?"), "test"))


# ----------------------------------------------------------------------------------------------
# the CLIs


@pytest.fixture
def tiny_policy(tmp_path):
    from tests.tiny_world_policy import save_tiny_world_policy

    return save_tiny_world_policy(tmp_path / "policy")


def _ppo_args(policy, out, *extra):
    return ["--model_name_or_path", str(policy), "--reward", "gold", "--build_missing", "false", "--output_dir",
            str(out),
            "--report_to", "none", "--disable_tqdm", "true", *extra]


@pytest.mark.parametrize("case", ["test_split", "overlap", "parquet_missing"])
def test_ppo_refuses_test_prompts_and_overlap_before_any_model_loads(case, tiny_policy, tmp_path, capsys,
                                                                     monkeypatch):
    import rl.ppo_setup
    from rl import ppo_step

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(rl.ppo_setup, "load_policy", no_loading)
    train = _jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    if case == "test_split":
        flags = ["--dataset", str(_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)), "--eval_dataset", "none"]
        message = "gsm8k_test.jsonl: is a test split, not training data"
    elif case == "overlap":
        flags = ["--dataset", str(train), "--eval_dataset", str(_jsonl(tmp_path / "eval.jsonl", GSM8K_ROWS[1:]))]
        message = "share 2 of 2 evaluation questions"
    else:
        flags = ["--dataset", str(tmp_path / "prompts.parquet")]
        message = "prompts.parquet: no such file"
    code = ppo_step.main(_ppo_args(tiny_policy, tmp_path / "run", *flags))
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert not (tmp_path / "run").exists()


def test_ppo_takes_a_test_split_when_told(tiny_policy, tmp_path):
    from rl.ppo_cli import parse_config
    from rl.ppo_setup import load_run_problems

    test_file = _jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)
    args = parse_config(_ppo_args(tiny_policy, tmp_path / "run", "--dataset", str(test_file), "--eval_dataset",
                                  "none", "--allow_test_split", "true"))
    train, evaluation = load_run_problems(args)
    assert [p.answer for p in train.problems] == ["7", "1080", "10"] and evaluation is None


def test_annotation_refuses_a_test_split(tmp_path, capsys):
    from reward_models import annotate as ann

    data = _jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)
    code = ann.main(["--method", "mc", "--policy", str(tmp_path / "none"), "--data", str(data),
                     "--out", str(tmp_path / "a.jsonl"), "--disable_tqdm", "true"])
    err = capsys.readouterr().err
    assert code == 2 and "is a test split" in err and "--allow_test_split" in err, err


def test_evaluate_reads_a_parquet_file_with_solutions(tmp_path):
    datasets = pytest.importorskip("datasets")
    from inference.evaluate import EvalArguments, load_problems

    datasets.Dataset.from_list([{"problem": "1+1?", "solution": "\\boxed{2}"}]).to_parquet(str(tmp_path / "e.parquet"))
    args = EvalArguments(method="greedy", dataset=str(tmp_path / "e.parquet"), policy=str(tmp_path),
                         out=str(tmp_path / "out"))
    problems, world_rows = load_problems(args)
    assert [(p.question, p.answer, p.answer_kind) for p in problems] == [("1+1?", "2", "latex")] and world_rows == []


def test_gpu_recipe_trains_on_gsm8k_train_and_only_evaluates_on_its_test_split(tmp_path, monkeypatch):
    from pathlib import Path

    import datasets

    from rl.ppo_cli import parse_config
    from rl.ppo_setup import load_run_problems

    calls = []

    def hub(name, config=None, split=None, **kwargs):  # the Hub's GSM8K train split, offline
        calls.append((name, config, split))
        return datasets.Dataset.from_list(GSM8K_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    _jsonl(tmp_path / "gsm8k_test.jsonl", [{"id": "gsm8k-test-0", "question": "Another question?", "answer": "3"}])
    monkeypatch.setenv("STEPRL_DATA_DIR", str(tmp_path))
    recipe = Path(__file__).resolve().parents[1] / "configs" / "ppo" / "gpu_qwen_math.yaml"
    # bf16 needs a GPU; the recipe's wandb is checked at parse time, so it is turned off here
    args = parse_config(["--config", str(recipe), "--bf16", "false", "--report_to", "none"])
    assert args.model_name_or_path == "Qwen/Qwen2.5-Math-1.5B-Instruct" and args.max_steps == 200
    train, evaluation = load_run_problems(args)
    assert calls == [("openai/gsm8k", "main", "train")]
    assert train.split == "train" and [p.answer for p in train.problems] == ["7", "1080", "10"]
    assert evaluation.split == "test" and [p.id for p in evaluation.problems] == ["gsm8k-test-0"]
