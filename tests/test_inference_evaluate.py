"""The evaluation harness: CLI end to end on a tiny policy, summary vs rows, resume, refusal, blinding."""

import json
import shutil
import sys
import types
from dataclasses import asdict, dataclass

import pytest

from backends.base import Completion
from inference import evaluate as ev
from inference.methods.base import MethodOutput
from reasoning.benchmarks import default_data_dir
from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.types import Problem
from reasoning.world import WorldConfig, generate

WORLD = WorldConfig(min_steps=1, max_steps=2)
TOKENS = ["--max_new_tokens", "10", "--quiet"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny untrained Llama policy with a BPE tokenizer trained on world text, and its world config."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("policy")
    rows = generate("train", 60, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "world_config.json").write_text(json.dumps(asdict(WORLD)))
    return out


def cli(*args):
    return ev.main([str(a) for a in args])


def rows_of(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def summary_of(out):
    return json.loads((out / "summary.json").read_text())


def world_args(policy_dir, out, method="greedy", n=5):
    return ["--method", method, "--dataset", "world", "--n_world", n, "--policy", policy_dir, "--out", out, *TOKENS]


# ----------------------------------------------------------------------------------------------
# the CLI on the world


def test_greedy_world_cli(policy_dir, tmp_path, capsys):
    out = tmp_path / "greedy"
    assert cli(*world_args(policy_dir, out), "--chunk_size", 2) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows, summary = rows_of(out), summary_of(out)
    assert printed == summary
    expected = generate("test", 5, 0, WORLD)  # the world the policy was saved with, test split
    assert [r["id"] for r in rows] == [r["id"] for r in expected]
    assert [r["answer"] for r in rows] == [r["answer"] for r in expected]
    for r in rows:
        assert {"id", "question", "answer", "prediction", "correct", "completion", "usage", "flags", "trace",
                "error_kind"} <= set(r)
        assert r["usage"]["llm_calls"] == 1 and 1 <= r["usage"]["completion_tokens"] <= 10
    for key in ("accuracy", "n", "generator_prompt_tokens", "generator_completion_tokens", "verifier_tokens",
                "llm_calls", "wall_seconds", "method", "method_config", "dataset", "policy", "verifier", "backend",
                "seed", "flags", "accuracy_ci95"):
        assert key in summary, key
    assert summary["n"] == 5 and summary["complete"] and summary["method"] == "greedy"
    assert summary["accuracy"] == sum(r["correct"] for r in rows) / 5
    assert summary["generator_prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in rows)
    assert summary["generator_completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in rows)
    assert summary["llm_calls"] == 5 and summary["verifier_tokens"] == 0
    assert summary["method_config"] == {"max_new_tokens": 10, "seed": 0}
    assert summary["verifier"] is None and summary["verifier_is_reference"] is False
    assert summary["flags"].get("truncated", 0) == sum("truncated" in r["flags"] for r in rows)
    assert summary["flag_occurrences"] == summary["flags"]  # greedy: one generation, each flag once
    assert summary["no_prediction"] == sum(r["prediction"] is None for r in rows)
    lo, hi = summary["accuracy_ci95"]
    assert 0.0 <= lo <= summary["accuracy"] <= hi <= 1.0
    assert summary["wall_seconds"] > 0 and summary["runs"] == 1 and summary["resume"]["chunks_run"] == 3

    # A finished run, run again: nothing is generated, nothing duplicated, the same summary.
    assert cli(*world_args(policy_dir, out), "--chunk_size", 2) == 0
    assert rows_of(out) == rows
    again = summary_of(out)
    assert again["runs"] == 2 and again["wall_seconds"] == summary["wall_seconds"]
    assert {k: v for k, v in again.items() if k != "runs"} == {k: v for k, v in summary.items() if k != "runs"}

    # Other options are refused, naming what changed.
    capsys.readouterr()
    assert cli(*world_args(policy_dir, out), "--chunk_size", 2, "--max_new_tokens", 11) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens" in err and "--overwrite" in err
    assert cli(*world_args(policy_dir, out), "--chunk_size", 3) == 2
    assert "chunk_size" in capsys.readouterr().err
    assert rows_of(out) == rows


def test_resume_after_kill_matches_uninterrupted_run(policy_dir, tmp_path, capsys):
    """A sampling method, chunks of 2: a run killed mid-write and resumed writes the same rows."""
    args = ["--n", 2, "--temperature", 1.0, "--chunk_size", 2, "--seed", 3]
    full = tmp_path / "full"
    assert cli(*world_args(policy_dir, full, "self_consistency", n=6), *args) == 0
    full_rows = rows_of(full)
    assert len(full_rows) == 6

    # The kill: chunk 0 written, chunk 1 half written with a torn last line.
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(full / "run_config.json", killed / "run_config.json")
    lines = (full / "results.jsonl").read_text().splitlines(keepends=True)
    (killed / "results.jsonl").write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    progress = (full / "progress.jsonl").read_text().splitlines(keepends=True)
    (killed / "progress.jsonl").write_text("".join(progress[:2]))  # start + chunk 0
    assert cli(*world_args(policy_dir, killed, "self_consistency", n=6), *args) == 0
    resumed = rows_of(killed)
    ids = [r["id"] for r in resumed]
    assert len(ids) == len(set(ids)) == 6
    assert {r["id"]: r for r in resumed} == {r["id"]: r for r in full_rows}
    summary = summary_of(killed)
    assert summary["resume"]["partial_lines_dropped"] == 1 and summary["runs"] == 2
    assert summary["accuracy"] == summary_of(full)["accuracy"]
    assert summary["generator_completion_tokens"] == summary_of(full)["generator_completion_tokens"]
    assert summary["llm_calls"] == 12


@pytest.mark.parametrize("source", ["world", "world_jsonl"])
def test_exact_verifier_is_labelled_a_reference(policy_dir, tmp_path, source):
    out = tmp_path / "bon"
    args = world_args(policy_dir, out, "best_of_n", n=3)
    if source == "world_jsonl":  # world rows saved as a file: the exact verifier reads their `world` field
        data = tmp_path / "world.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in generate("test", 3, 0, WORLD)))
        args[args.index("--dataset") + 1] = data
    code = cli(*args, "--n", 2, "--temperature", 1.0, "--verifier", "exact")
    assert code == 0
    summary, rows = summary_of(out), rows_of(out)
    assert summary["verifier"] == "exact" and summary["verifier_is_reference"] is True
    assert summary["verifier_calls"] == sum(r["usage"]["verifier_calls"] for r in rows) > 0
    assert summary["llm_calls"] == 6
    assert all(len(r["trace"]["samples"]) == 2 for r in rows)


def test_verifier_method_without_verifier_is_a_clear_error(policy_dir, tmp_path, capsys):
    code = cli(*world_args(policy_dir, tmp_path / "x", "best_of_n", n=2), "--n", 1)
    assert code == 2 and "--verifier" in capsys.readouterr().err


def test_exact_verifier_needs_world_data(policy_dir, tmp_path, capsys):
    data = tmp_path / "plain.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "What is 1 + 1?", "answer": "2"}) + "\n")
    code = cli("--method", "greedy", "--dataset", data, "--policy", policy_dir, "--out", tmp_path / "o",
               "--verifier", "exact", *TOKENS)
    assert code == 2 and "world" in capsys.readouterr().err


def test_openai_backend_against_the_toolkit_server(policy_dir, tmp_path):
    """--backend openai through the factory, served on loopback: the same greedy rows as --backend hf."""
    from backends.hf import HFGenerator
    from backends.serve import CompletionServer

    local = tmp_path / "hf"
    assert cli(*world_args(policy_dir, local, n=3)) == 0
    generator = HFGenerator.from_pretrained(str(policy_dir), batch_size=16, device="cpu")
    with CompletionServer(generator, str(policy_dir), host="127.0.0.1", port=0) as server:
        served = tmp_path / "openai"
        options = json.dumps({"base_url": server.url, "max_retries": 0})
        assert cli(*world_args(policy_dir, served, n=3), "--backend", "openai", "--backend_options", options) == 0
    keep = ("id", "prediction", "correct", "completion", "usage")
    assert [{k: r[k] for k in keep} for r in rows_of(served)] == [{k: r[k] for k in keep} for r in rows_of(local)]
    assert summary_of(served)["backend"] == "openai"


def test_bad_backend_option_is_a_clear_error(policy_dir, tmp_path, capsys):
    code = cli(*world_args(policy_dir, tmp_path / "o", n=1), "--backend_options", '{"warp_speed": 9}')
    assert code == 2 and "warp_speed" in capsys.readouterr().err
    # nothing was written under those settings, so the corrected command is not refused
    assert cli(*world_args(policy_dir, tmp_path / "o", n=1)) == 0
    assert summary_of(tmp_path / "o")["runs"] == 1


@pytest.mark.skipif(
    default_data_dir() is None or not (default_data_dir() / "svamp.jsonl").is_file(),
    reason="no benchmark data: ../shared/data (or $STEPRL_DATA_DIR) with svamp.jsonl is absent",
)
def test_benchmark_by_name_with_limit(policy_dir, tmp_path):
    out = tmp_path / "svamp"
    assert cli("--method", "greedy", "--dataset", "svamp", "--limit", 3, "--policy", policy_dir, "--out", out,
               *TOKENS) == 0
    rows, summary = rows_of(out), summary_of(out)
    assert len(rows) == 3 and summary["n"] == 3 and summary["dataset"] == "svamp"
    assert rows[0]["id"] == "svamp-chal-1" and rows[0]["answer"] == "51"
    assert "error_kind" not in rows[0] and "error_mix" not in summary


# ----------------------------------------------------------------------------------------------
# flags from the method's Config


def test_method_options_become_flags(capsys):
    args, module, config = ev.parse_args(["--method", "stepco", "--dataset", "world", "--policy", "p", "--out", "o",
                                          "--threshold", "0.3", "--max_rounds", "2", "--verify_final", "false"])
    assert module.__name__ == "inference.methods.stepco"
    assert (config.threshold, config.max_rounds, config.verify_final) == (0.3, 2, False)
    assert args.chunk_size == 50 and args.backend == "hf"
    with pytest.raises(SystemExit) as e:
        ev.parse_args(["--method", "best_of_n", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--aggregation" in text and "Samples per problem" in text and "--verifier" in text


@pytest.mark.parametrize("bad", [["--max_new_tokens", "abc"], ["--aggregation", "median"], ["--nonsense", "1"],
                                 ["--backend", "tpu"], ["--chunk_size", "0"], ["--max_new_tokens", "-5"],
                                 ["--n", "0"], ["--top_p", "0"]])
def test_bad_values_exit_2(bad, tmp_path, capsys):
    code = cli("--method", "best_of_n", "--dataset", "world", "--policy", tmp_path, "--out", tmp_path / "o", *bad)
    assert code == 2
    assert bad[0].lstrip("-") in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_out_naming_a_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file\n")
    for out in (tmp_path / "taken", tmp_path / "taken" / "run"):
        code = cli("--method", "greedy", "--dataset", "world", "--policy", tmp_path, "--out", out)
        err = capsys.readouterr().err
        assert code == 2 and "is a file" in err and len(err.strip().splitlines()) == 1


def test_openai_backend_without_a_server_is_one_line_before_anything_loads(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = json.dumps({"base_url": f"http://127.0.0.1:{port}/v1"})
    code = cli("--method", "greedy", "--dataset", "no_such_benchmark", "--policy", "served", "--backend", "openai",
               "--backend_options", options, "--out", tmp_path / "o")
    err = capsys.readouterr().err
    assert code == 2 and "no server answers" in err and f"127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()  # the dataset was not read yet


def test_prompt_longer_than_the_context_is_flagged_and_not_run(policy_dir, tmp_path, capsys):
    """The tiny policy takes 1,024 positions: a 3,000-word question is flagged, never generated."""
    data = tmp_path / "long.jsonl"
    rows = [{"id": "short", "question": "What is 1 + 1?", "answer": "2"},
            {"id": "long", "question": "apples " * 3000 + "How many?", "answer": "3"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o"
    assert cli("--method", "greedy", "--dataset", data, "--policy", policy_dir, "--out", out, *TOKENS) == 0
    short, long = rows_of(out)
    assert long["flags"][0] == "prompt_too_long" and long["prediction"] is None and long["usage"]["llm_calls"] == 0
    assert "prompt_too_long" not in short["flags"] and short["usage"]["llm_calls"] == 1
    summary = summary_of(out)
    assert summary["prompt_too_long"] == 1 and summary["flags"]["prompt_too_long"] == 1
    # max_new_tokens beyond the context is capped (and then no prompt fits: all flagged, none run)
    capsys.readouterr()
    capped = tmp_path / "capped"
    assert cli(*world_args(policy_dir, capped, n=2), "--max_new_tokens", 100000) == 0
    assert "capped to 1023" in capsys.readouterr().err
    assert summary_of(capped)["prompt_too_long"] == 2 and summary_of(capped)["llm_calls"] == 0


def test_unknown_method_and_missing_flags(tmp_path, capsys):
    assert cli("--method", "telepathy", "--dataset", "world", "--policy", tmp_path, "--out", tmp_path / "o") == 2
    assert "telepathy" in capsys.readouterr().err
    assert cli("--method", "greedy", "--dataset", "world") == 2
    assert "--policy" in capsys.readouterr().err


def test_yaml_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: best_of_n\ndataset: world\nchunk_size: 7\nn: 4\nmethod_options:\n  aggregation: min\n")
    args, _, config = ev.parse_args(["--config", str(recipe), "--policy", "p", "--out", "o", "--n", "5"])
    assert (args.chunk_size, config.n, config.aggregation) == (7, 5, "min")
    recipe.write_text("method: greedy\nthreshold: 0.5\n")
    with pytest.raises(ev.EvaluationError, match="threshold"):
        ev.parse_args(["--config", str(recipe)])


# ----------------------------------------------------------------------------------------------
# the Python API with a fake method and a fake generator


@dataclass
class BlindConfig:
    max_new_tokens: int = 8
    """Token limit."""
    seed: int = 0
    """Seed."""


def _blind_run(problems, tracker, config):
    outputs = tracker.generate(list(range(len(problems))), [p.question for p in problems], _params(config))
    results = []
    for i, (p, (c,)) in enumerate(zip(problems, outputs)):
        assert p.answer == "" and p.meta == {}, "the gold answer reached the method"
        results.append(MethodOutput(prediction=c.text or None, completion=c.text, usage=tracker.usage[i],
                                    trace={"seed": config.seed}, flags=[] if c.text else ["no_answer"]))
    return results


def _params(config):
    from backends.base import SamplingParams

    return SamplingParams(max_new_tokens=config.max_new_tokens, seed=config.seed)


class EchoGenerator:
    """Answers the number after 'echo' in the prompt; prompt tokens = words, completion tokens = 3."""

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            words = p.split()
            text = words[words.index("echo") + 1] if "echo" in words else ""
            out.append([Completion(text, len(words), 3, "stop") for _ in range(params.n)])
        return out


@pytest.fixture
def blind_method(monkeypatch):
    module = types.ModuleType("inference.methods.fake_blind")
    module.Config, module.run = BlindConfig, _blind_run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_gold_never_reaches_the_method_and_grading_happens_after(blind_method, tmp_path):
    problems = [
        Problem("a", "please echo 4", "4", meta={"secret": 1}),
        Problem("b", "please echo 5", "6", meta={"secret": 2}),
        Problem("c", "no answer here", "1"),
        Problem("d", "please echo 1/2", "0.5"),
    ]
    summary = ev.evaluate("fake_blind", problems, EchoGenerator(), None, None, tmp_path / "r", chunk_size=3,
                          run_info={"dataset": "inline"}, quiet=True)
    rows = rows_of(tmp_path / "r")
    assert [r["correct"] for r in rows] == [True, False, False, True]
    assert [r["prediction"] for r in rows] == ["4", "5", None, "1/2"]
    assert summary["accuracy"] == 0.5 and summary["correct"] == 2 and summary["no_prediction"] == 1
    assert summary["generator_prompt_tokens"] == 3 + 3 + 3 + 3 and summary["generator_completion_tokens"] == 12
    assert summary["total_tokens"] == 24 and summary["flags"] == {"no_answer": 1}
    assert summary["dataset"] == "inline" and summary["method"] == "fake_blind"
    # each chunk ran with its own seed, derived from (seed, chunk index)
    assert [r["trace"]["seed"] for r in rows] == [ev.chunk_seed(0, 0)] * 3 + [ev.chunk_seed(0, 1)]
    assert ev.chunk_seed(0, 0) != ev.chunk_seed(1, 0)

    # the same directory with other problems is refused
    with pytest.raises(ev.EvaluationError, match="problems"):
        ev.evaluate("fake_blind", problems[:3], EchoGenerator(), None, None, tmp_path / "r", chunk_size=3,
                    run_info={"dataset": "inline"}, quiet=True)


def test_corrupt_row_in_the_middle_is_an_error(blind_method, tmp_path):
    problems = [Problem(str(i), f"echo {i}", str(i)) for i in range(3)]
    out = tmp_path / "r"
    ev.evaluate("fake_blind", problems, EchoGenerator(), out_dir=out, chunk_size=1, quiet=True)
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(lines[0] + "{oops\n" + lines[2])
    with pytest.raises(ev.EvaluationError, match=r"results.jsonl:2"):
        ev.evaluate("fake_blind", problems, EchoGenerator(), out_dir=out, chunk_size=1, quiet=True)
    # --overwrite starts afresh
    summary = ev.evaluate("fake_blind", problems, EchoGenerator(), out_dir=out, chunk_size=1, quiet=True,
                          overwrite=True)
    assert summary["n"] == 3 and summary["accuracy"] == 1.0 and summary["runs"] == 1


@dataclass
class ClashConfig:
    batch_size: int = 3
    """The method's own batch size (a harness flag has the same name)."""
    verbose: bool = True
    """A boolean that is on by default."""


def test_a_method_option_named_like_a_harness_flag_is_method_prefixed(monkeypatch, tmp_path, capsys):
    module = types.ModuleType("inference.methods.fake_clash")
    module.Config, module.run = ClashConfig, _blind_run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    base = ["--method", "fake_clash", "--dataset", "world", "--policy", "p", "--out", "o"]
    args, _, config = ev.parse_args([*base, "--batch_size", "7", "--method_batch_size", "5", "--no_verbose"])
    assert (args.batch_size, config.batch_size, config.verbose) == (7, 5, False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("method: fake_clash\nbatch_size: 9\nmethod_options: {batch_size: 4}\n")
    args, _, config = ev.parse_args(["--config", str(recipe), "--policy", "p", "--dataset", "world", "--out", "o"])
    assert (args.batch_size, config.batch_size) == (9, 4)
    with pytest.raises(SystemExit):
        ev.parse_args([*base, "--help"])
    assert "--method_batch_size" in capsys.readouterr().out


class CannedGenerator:
    """Answers each prompt with the text its question names in `TEXTS` (a prompt per question word)."""

    TEXTS = {"stated": "3 + 9 = 12. The answer is <ans>12</ans>.", "trailing": "She has 3 + 9 = 12",
             "none": "She has many apples.", "wrong": "The answer is <ans>11</ans>."}

    def generate(self, prompts, params):
        return [[Completion(next(t for k, t in self.TEXTS.items() if k in p), 4, 3, "stop")] * params.n
                for p in prompts]


def _extracting_run(problems, tracker, config):
    from reasoning.answers import extract_answer

    outputs = tracker.generate(list(range(len(problems))), [p.question for p in problems], _params(config))
    return [MethodOutput(prediction=extract_answer(c.text), completion=c.text, usage=tracker.usage[i])
            for i, (c,) in enumerate(outputs)]


def test_summary_and_rows_give_accuracy_under_both_answer_checks(monkeypatch, tmp_path):
    module = types.ModuleType("inference.methods.fake_extracting")
    module.Config, module.run = BlindConfig, _extracting_run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    kinds = ["stated", "trailing", "trailing", "none", "wrong"]
    problems = [Problem(f"p{i}", f"question {kind}", "12") for i, kind in enumerate(kinds)]
    summary = ev.evaluate("fake_extracting", problems, CannedGenerator(), out_dir=tmp_path / "r", quiet=True,
                          bootstrap_samples=200)
    rows = rows_of(tmp_path / "r")
    # flexible (the headline): the stated answer and the two trailing numbers; strict: the stated one only
    assert [r["correct"] for r in rows] == [True, True, True, False, False]
    assert [r["correct_strict"] for r in rows] == [True, False, False, False, False]
    assert summary["correct"] == 3 and summary["accuracy"] == 0.6
    assert summary["correct_strict"] == 1 and summary["accuracy_strict"] == 0.2
    lo, hi = summary["accuracy_strict_ci95"]
    assert 0.0 <= lo <= 0.2 <= hi <= 1.0
    assert summary["accuracy_ci95"] != summary["accuracy_strict_ci95"]
    # rows written before the strict check existed: it is recovered from the row (right and stated)
    old = [{k: v for k, v in r.items() if k != "correct_strict"} for r in rows]
    assert ev.summarize(old, bootstrap_samples=50)["correct_strict"] == 1
