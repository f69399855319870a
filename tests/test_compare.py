"""The comparison (`compare`, run by scripts/compare.py): the quick run end to end (train, evaluate,
report), its cache and its config."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compare import cache as artefact_cache
from compare import cells, cli, config, train

ROOT = Path(__file__).resolve().parents[1]
CLEAN = ROOT / "configs" / "compare" / "clean_world.yaml"
"""The clean-teacher recipe: a PSV trained here (StepCo tree labels) joined with step-confidence."""


def _markers(cache: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime for p in cache.glob(f"*/{artefact_cache.MARKER}")}


@pytest.mark.slow
def test_quick_run_writes_every_cell_and_rerun_reuses_the_cache(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = ["--quick", "--out", str(out), "--cache_dir", str(cache), "--n_problems", "3"]
    assert cli.main(argv) == 0

    for name in ("report.md", "summary.json", "accuracy_vs_tokens.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "accuracy_vs_tokens.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    s = json.loads((out / "summary.json").read_text())
    policies, methods = ["sft", "outcome_ppo", "step_ppo"], ["greedy", "self_consistency", "best_of_n", "stepco",
                                                             "beats"]
    assert s["policies"] == policies and s["n_problems"] == 3 and s["total_wall_seconds"] > 0
    for policy in policies:
        cells = s["table"][policy]
        assert set(cells) == {*methods, config.REFERENCE}, policy
        for label, c in cells.items():
            assert c["n"] == 3, (policy, label)
            assert 0.0 <= c["accuracy"] <= 1.0
            lo, hi = c["accuracy_ci95"]
            assert 0.0 <= lo <= c["accuracy"] <= hi <= 1.0
            assert c["generator_tokens"] > 0 and c["total_tokens"] >= c["generator_tokens"] and c["llm_calls"] > 0
        assert cells["best_of_n"]["verifier_tokens"] > 0  # the PSV scored every sample and is counted
        assert cells["greedy"]["verifier_tokens"] == 0 and cells["stepco"]["verifier_is_reference"] is False
        assert cells[config.REFERENCE]["verifier_is_reference"] is True
        # the curves read from one run agree with that run at its own N and T
        curves = s["curves"][policy]
        for method in ("self_consistency", "best_of_n"):
            assert [p["n"] for p in curves[method]] == [1, 2, 4]
            last = curves[method][-1]
            assert last["accuracy"] == pytest.approx(cells[method]["accuracy"])
            assert last["tokens_per_problem"] == pytest.approx(cells[method]["tokens_per_problem"])
        assert [p["t"] for p in curves["stepco"]] == [1, 2]
        assert curves["stepco"][-1]["accuracy"] == pytest.approx(cells["stepco"]["accuracy"])
        assert curves["stepco"][-1]["tokens_per_problem"] == pytest.approx(cells["stepco"]["tokens_per_problem"])
        changes = s["answer_changes"][policy]["stepco"]
        assert sum(changes[k] for k in ("correct_to_correct", "incorrect_to_correct", "correct_to_incorrect",
                                        "incorrect_to_incorrect")) == 3
        assert changes["correct_to_correct"] + changes["incorrect_to_correct"] == cells["stepco"]["correct"]
    cal = s["stepco_threshold"]
    assert cal["dev_paths"] > 0 and 0.0 <= cal["threshold"] <= 1.0
    if cal["fallback"]:  # no correct (or no erroneous) dev path: F1 undefined, the configured θ is kept
        assert cal["threshold"] == cal["configured_threshold"] and "both" in cal["fallback"]
    for policy in policies:  # one θ for every policy and for the reference
        for label in ("stepco", config.REFERENCE):
            cell = json.loads((out / "eval" / policy / label / "summary.json").read_text())
            assert cell["method_config"]["threshold"] == pytest.approx(cal["threshold"])
    assert "StepCo's threshold" in (out / "report.md").read_text()
    # the default verifier is the verifier LM's step-likelihood: an LM trained here, no PSV trained
    assert {n: a["status"] for n, a in s["artefacts"].items()} == {
        "sft": "trained", "verifier_lm": "trained", "psv": "given", "outcome_ppo": "trained", "step_ppo": "trained"}
    assert s["artefacts"]["psv"]["spec"] == f"step-likelihood:{s['artefacts']['verifier_lm']['dir']}"
    assert s["verifier"] == s["artefacts"]["psv"]["spec"]
    assert s["budgets"]["gold_at_inference"] is False and s["effects"]["headline"]
    report = (out / "report.md").read_text()
    for text in ("| step-PPO | StepCo |", "reference", "correct → incorrect", "verifier tokens",
                 "accuracy_vs_tokens.png"):
        assert text in report, text

    # a second run: every artefact and every cell reused, nothing trained again
    before = _markers(cache)
    assert len(before) == 4  # sft, verifier LM, two PPO runs
    start = time.time()
    assert cli.main(argv) == 0
    assert time.time() - start < 60
    assert _markers(cache) == before
    again = json.loads((out / "summary.json").read_text())
    assert {n: a["status"] for n, a in again["artefacts"].items()} == {
        "sft": "reused", "verifier_lm": "reused", "psv": "given", "outcome_ppo": "reused", "step_ppo": "reused"}
    assert again["table"] == s["table"]

    # a benchmark instead of the world: the same policies, nothing trained, no exact-checker reference
    data = ROOT.parent / "shared" / "data"
    if (data / "gsm8k_test.jsonl").exists():
        bench = tmp_path / "gsm8k"
        assert cli.main(["--quick", "--out", str(bench), "--cache_dir", str(cache), "--n_problems", "2",
                             "--set", "eval.dataset=gsm8k", "--set", "eval.source=local",
                             "--set", "eval.threshold_dev_problems=null",
                             "--set", f"eval.data_dir={data}"]) == 0
        assert _markers(cache) == before
        g = json.loads((bench / "summary.json").read_text())
        assert g["dataset"] == "gsm8k" and g["reference"] is None
        assert all(set(g["table"][p]) == set(methods) and g["table"][p]["greedy"]["n"] == 2 for p in policies)


def test_shipped_recipe_is_the_embedded_default():
    assert config.load_config(config.DEFAULT_CONFIG) == config.CompareConfig()
    quick = config.load_config(None, quick=True)
    assert quick.workers == 1 and quick.ppo.args["max_steps"] == 2
    assert quick.sft.args["tasks"] == config.CompareConfig().sft.args["tasks"]  # revise, clarify, verify kept
    for task in ("revise", "clarify", "verify"):
        assert task in quick.sft.args["tasks"]


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(config.CompareError, match="eval.sampels"):
        config.load_config(None, sets=["eval.sampels=3"])
    with pytest.raises(config.CompareError, match="ppo.runs.step_ppo.args.max_steps: a budget flag"):
        config.load_config(None, sets=["ppo.runs.step_ppo.args.max_steps=5"])
    with pytest.raises(config.CompareError, match="max_steps: a budget flag"):  # an earlier name, translated
        config.load_config(None, sets=["ppo.runs.step_ppo.args.num_updates=5"])
    with pytest.raises(config.CompareError, match="eval.methods.stepco"):
        config.load_config(None, sets=["eval.methods.stepco.rounds=3"])
    with pytest.raises(config.CompareError, match="policies"):
        config.load_config(None, sets=["policies=[sft, dpo]"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval: [1, 2]\n")
    with pytest.raises(config.CompareError, match="eval"):
        config.load_config(bad)
    assert cli.main(["--out", str(tmp_path / "x"), "--set", "workers=0"]) == 2


def test_artefact_hashes_follow_what_defines_them(tmp_path):
    base = artefact_cache.artefacts(config.load_config(CLEAN, overrides={"cache_dir": str(tmp_path)}))
    psv = artefact_cache.artefacts(config.load_config(CLEAN, sets=["psv.n_problems=50"],
                                                      overrides={"cache_dir": str(tmp_path)}))
    assert psv["sft"].dir == base["sft"].dir
    assert psv["psv"].dir != base["psv"].dir and psv["step_ppo"].dir != base["step_ppo"].dir
    ev = artefact_cache.artefacts(config.load_config(CLEAN,
                                                     sets=["eval.n_problems=7", "eval.methods.stepco.threshold=0.7"],
                                                     overrides={"cache_dir": str(tmp_path)}))
    assert [a.hash for a in ev.values()] == [a.hash for a in base.values()]  # evaluation trains nothing new
    assert base["step_ppo"].dir.name.startswith("ppo-step-") and base["outcome_ppo"].dir.name.startswith("ppo-outcome-")
    given = artefact_cache.artefacts(config.load_config(CLEAN, sets=[f"sft.path={tmp_path}", "psv.path=confidence"]))
    assert "verifier_lm" not in given and given["sft"].given and given["sft"].spec == str(tmp_path)
    assert given["psv"].spec == "confidence"
    assert given["step_ppo"].key["policy"] == str(tmp_path)
    assert train.to_argv({"a": True, "b": None, "c": 2}) == ["--a", "true", "--c", "2"]


def test_combined_verifier_is_bound_to_the_sft_policy_and_keys_the_ppo_runs(tmp_path):
    cache = {"cache_dir": str(tmp_path)}
    base_cfg = config.load_config(CLEAN, sets=["psv.combine_with=null"], overrides=cache)
    base = artefact_cache.artefacts(base_cfg)
    assert artefact_cache.verifier_spec(base_cfg, base) == base["psv"].spec  # the PSV alone
    cfg = config.load_config(CLEAN, overrides=cache)  # the clean recipe joins the SFT policy's step confidence
    arts = artefact_cache.artefacts(cfg)
    spec = artefact_cache.verifier_spec(cfg, arts)
    assert spec == f"product:step-confidence:{arts['sft'].spec},{arts['psv'].spec}"
    assert arts["psv"].dir == base["psv"].dir and arts["step_ppo"].dir != base["step_ppo"].dir
    assert train.ppo_argv(cfg, "step_ppo", arts)[train.ppo_argv(cfg, "step_ppo", arts).index("--verifier") + 1] == spec
    # A bare confidence verifier given as the PSV reads the SFT policy, whichever policy is evaluated.
    given = config.load_config(CLEAN, sets=[f"sft.path={tmp_path}", "psv.path=confidence", "psv.combine_with=null"])
    assert artefact_cache.verifier_spec(given, artefact_cache.artefacts(given)) == f"confidence:{tmp_path}"
    with pytest.raises(config.CompareError, match="threshold_dev_problems"):
        config.load_config(None, sets=["eval.dataset=gsm8k"])
    for bad in ("psv.combine_rule=max", "psv.combine_with=min:a,b"):
        with pytest.raises(config.CompareError, match="psv.combine"):
            config.load_config(None, sets=["psv.combine_with=step-confidence", bad])


def test_evaluation_jobs_split_beats_from_the_other_methods_with_several_workers():
    cfg = config.load_config(None)
    labels = [label for label, _, _ in cells.cells(cfg, True)]
    assert cells.eval_groups(cfg, True, 1) == [labels]
    groups = cells.eval_groups(cfg, True, 2)
    assert groups == [["beats"], ["greedy", "self_consistency", "best_of_n", "stepco", config.REFERENCE]]
    assert sorted(sum(groups, [])) == sorted(labels)  # every cell in exactly one job
    no_beats = config.load_config(None, sets=["eval.methods.beats=null"])
    assert cells.eval_groups(no_beats, True, 2) == [["greedy", "self_consistency", "best_of_n", "stepco",
                                                      config.REFERENCE]]


def test_entry_point_is_the_package_cli(tmp_path):
    """scripts/compare.py, run from elsewhere, imports the package (not itself) and keeps its CLI."""
    script = ROOT / "scripts" / "compare.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "o"), "--dry_run",
                           "--cache_dir", str(tmp_path / "c")], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert list(plan["artefacts"]) == ["sft", "verifier_lm", "psv", "outcome_ppo", "step_ppo"]
    assert plan["cells"][-1] == config.REFERENCE
    bad = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "o"), "--set", "workers=0"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: workers") and "Traceback" not in bad.stderr


@pytest.mark.parametrize("item, key", [
    ("sft.args.lerning_rate=0.1", "sft.args.lerning_rate"),
    ("sft.args.learning_rate=fast", "sft.args.learning_rate"),
    ("sft.args.tasks=solve=1,dance=2", "sft.args"),
    ("ppo.args.num_updatez=3", "ppo.args.num_updatez"),
    ("ppo.args.per_device_train_batch_size=4", "ppo.args.per_device_train_batch_size"),
    ("ppo.runs.step_ppo.args.gradient_accumulation_steps=2", "ppo.runs.step_ppo.args.gradient_accumulation_steps"),
    ("ppo.runs.step_ppo.args.beta=-1", "ppo.runs.step_ppo"),
    ("ppo.runs.outcome_ppo.reward=outcom", "ppo.runs.outcome_ppo"),
    ("psv.combine_with=step-confidance", "psv.combine_with"),
    ("psv.path=step-likelihod:verifier_lm", "psv.path"),
    ("verifier_lm.args.teacher_noise=inverse=2", "verifier_lm.args"),
    ("verifier_lm.args.n_trian=5", "verifier_lm.args.n_trian"),
    ("psv.combine_with=product:step-confidence", "psv.combine_with"),
    ("eval.verifier=exakt", "eval.verifier"),
    ("eval.n_problems=[unclosed", "eval.n_problems=[unclosed"),
])
def test_every_section_is_checked_up_front_even_in_a_dry_run(item, key, tmp_path, capsys):
    """A typo in the flags of a later stage fails before any stage runs, as one line and exit 2."""
    assert cli.main(["--out", str(tmp_path / "o"), "--dry_run", "--set", item]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and key in captured.err.splitlines()[0]
    assert len(captured.err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_verifier_lm_is_trained_once_named_and_keys_what_reads_it(tmp_path):
    """The default verifier is the step-likelihood of a verifier LM trained here on the clean
    teacher: its spec reads the LM's directory, the PPO runs are keyed by the LM's ref, a change of
    its flags retrains it and what reads it (not the policy), and it is built only when named."""
    cache = {"cache_dir": str(tmp_path)}
    cfg = config.load_config(None, overrides=cache)
    arts = artefact_cache.artefacts(cfg)
    lm = arts["verifier_lm"]
    assert cfg.verifier_lm.args["teacher_noise"] == "none" and cfg.sft.args["teacher_noise"] != "none"
    assert lm.kind == "sft" and lm.dir != arts["sft"].dir and not lm.given
    spec = artefact_cache.verifier_spec(cfg, arts)
    assert spec == f"step-likelihood:{lm.dir}" == arts["psv"].spec
    assert artefact_cache.verifier_spec(cfg, arts, ref=True) == f"step-likelihood:{lm.ref}"
    # the default PPO runs are paid by the answer check: no verifier passed, none in their key
    assert "--verifier" not in train.ppo_argv(cfg, "step_ppo", arts) and arts["step_ppo"].key["verifier"] is None
    paid = config.load_config(None,
                              sets=["ppo.runs.step_ppo.reward=step",
                                    "ppo.runs.step_ppo.args.advantage_estimator=group"], overrides=cache)
    paid_arts = artefact_cache.artefacts(paid)
    argv = train.ppo_argv(paid, "step_ppo", paid_arts)
    assert argv[argv.index("--verifier") + 1] == spec
    assert paid_arts["step_ppo"].key["verifier"] == f"step-likelihood:{lm.ref}"
    assert train.sft_command(cfg, lm)[-2:] == ["--output_dir", str(lm.dir)]
    assert "--teacher_noise" in train.sft_command(cfg, lm) and train.sft_args(cfg, lm) == cfg.verifier_lm.args
    # the verifier LM's flags key it and everything it judges, never the policy
    other = artefact_cache.artefacts(config.load_config(None, sets=["verifier_lm.args.n_train=1000"], overrides=cache))
    assert other["sft"].dir == arts["sft"].dir
    assert other["verifier_lm"].dir != lm.dir and other["step_ppo"].dir == arts["step_ppo"].dir
    other_paid = artefact_cache.artefacts(config.load_config(
        None, sets=["verifier_lm.args.n_train=1000", "ppo.runs.step_ppo.reward=step",
              "ppo.runs.step_ppo.args.advantage_estimator=group"], overrides=cache))
    assert other_paid["step_ppo"].dir != paid_arts["step_ppo"].dir
    assert other_paid["outcome_ppo"].dir == arts["outcome_ppo"].dir
    # joined with another verifier, or as the methods' verifier only, it is still resolved
    joined = config.load_config(None, sets=["psv.path=confidence", "psv.combine_with=step-likelihood:verifier_lm"],
                                overrides=cache)
    ja = artefact_cache.artefacts(joined)
    assert artefact_cache.verifier_spec(joined, ja) == (
        f"product:step-likelihood:{ja['verifier_lm'].dir},confidence:{ja['sft'].spec}")
    methods_only = config.load_config(None, sets=["psv.path=confidence", "eval.verifier=step-likelihood:verifier_lm"],
                                      overrides=cache)
    ma = artefact_cache.artefacts(methods_only)
    assert artefact_cache.methods_verifier_spec(methods_only, ma) == f"step-likelihood:{ma['verifier_lm'].dir}"
    # named nowhere: not built; given as a path: used as it is
    assert "verifier_lm" not in artefact_cache.artefacts(config.load_config(None, sets=["psv.path=confidence"]))
    given = config.load_config(None, sets=[f"verifier_lm.path={tmp_path}"], overrides=cache)
    ga = artefact_cache.artefacts(given)
    assert ga["verifier_lm"].given and artefact_cache.verifier_spec(given, ga) == f"step-likelihood:{tmp_path}"
    assert ga["step_ppo"].key["verifier"] is None  # paid by the answer check
    gp = artefact_cache.artefacts(config.load_config(None,
                                                     sets=[f"verifier_lm.path={tmp_path}",
                                                           "ppo.runs.outcome_ppo.reward=outcome"],
                                                     overrides=cache))
    assert gp["outcome_ppo"].key["verifier"] == f"step-likelihood:{tmp_path}"
    with pytest.raises(config.CompareError, match="verifier_lm.args.output_dir"):
        config.load_config(None, sets=["verifier_lm.args.output_dir=x"])
