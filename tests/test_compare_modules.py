"""The modules of `compare`, each alone: config parsing, cache keys, curves read from traces,
the report rendered from given rows, the plot."""

import json

import pytest

from compare import analysis, cache, config, curves, plot, report
from reasoning.steps import join_steps
from reasoning.types import Problem

PROBLEMS = {"a": Problem(id="a", question="What is 2 + 3?", answer="5"),
            "b": Problem(id="b", question="What is 4 + 4?", answer="8")}


# ----------------------------------------------------------------------------------------------
# config


def test_set_items_are_yaml_values_under_dotted_keys():
    expected = {"eval": {"methods": {"stepco": {"threshold": 0.6}}}}
    assert config.parse_set("eval.methods.stepco.threshold=0.6") == expected
    assert config.parse_set("policies=[sft, step_ppo]") == {"policies": ["sft", "step_ppo"]}
    assert config.parse_set("psv.path=") == {"psv": {"path": None}}
    with pytest.raises(config.CompareError, match="section.key=value"):
        config.parse_set("no_equals_sign")


def test_deep_merge_merges_mappings_and_replaces_the_rest():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    assert config.deep_merge(base, {"a": {"y": [3]}, "c": 2}) == {"a": {"x": 1, "y": [3]}, "b": 1, "c": 2}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1}  # not modified


def test_config_types_are_checked_and_a_resolved_config_round_trips():
    with pytest.raises(config.CompareError, match="eval.n_problems"):
        config.load_config(None, sets=["eval.n_problems=many"])
    cfg = config.load_config(None, sets=["eval.n_problems=7"])
    assert config.from_dict(json.loads(json.dumps(config.plain(cfg)))) == cfg


# ----------------------------------------------------------------------------------------------
# cache keys


def test_cache_keys_are_stable_and_follow_their_inputs(tmp_path):
    clean = config.ROOT / "configs" / "compare" / "clean_world.yaml"  # a PSV trained here
    cfg = config.load_config(clean, overrides={"cache_dir": str(tmp_path)})
    arts = cache.artefacts(cfg)
    assert cache.digest({"a": 1, "b": 2}) == cache.digest({"b": 2, "a": 1})
    assert arts["sft"].dir == tmp_path / f"sft-{arts['sft'].hash}" and not arts["sft"].complete()
    assert arts["psv"].key["policy"] == arts["sft"].ref  # the PSV is keyed by the policy it annotates
    other = cache.artefacts(config.load_config(clean, sets=["sft.args.hidden_size=64"],
                                               overrides={"cache_dir": str(tmp_path)}))
    assert all(other[n].hash != arts[n].hash for n in arts)  # everything downstream changes too
    coded = cache.artefacts(config.load_config(None, sets=["rebuild_on_code_change=true"]))
    assert coded["sft"].key["code"] == cache.code_digest("sft")


# ----------------------------------------------------------------------------------------------
# curves: tokens read from the traces, apportioned only for old traces


def _usage(rows):
    return {k: sum(r[k] for r in rows) for k in ("prompt_tokens", "completion_tokens", "verifier_tokens")}


def _bon_row(pid, answers, scores, tokens, records=True):
    samples = [{"text": join_steps([f"so {x}", f"<ans>{x}</ans>"]), "answer": x, "score": s,
                **(dict(zip(("prompt_tokens", "completion_tokens", "verifier_tokens"), t)) if records else {})}
               for x, s, t in zip(answers, scores, tokens)]
    usage = _usage([dict(zip(("prompt_tokens", "completion_tokens", "verifier_tokens"), t)) for t in tokens])
    return {"id": pid, "question": PROBLEMS[pid].question, "trace": {"samples": samples}, "usage": usage}


def test_best_of_n_curve_reads_each_samples_tokens():
    rows = [_bon_row("a", ["5", "7"], [0.2, 0.9], [(10, 3, 20), (10, 40, 90)]),
            _bon_row("b", ["8", "8"], [0.5, 0.1], [(12, 5, 30), (12, 6, 31)])]
    n1, n2 = curves.sample_curve(rows, "best_of_n", [1, 2], PROBLEMS)
    assert (n1["accuracy"], n2["accuracy"]) == (1.0, 0.5)  # at N=2 problem a picks the wrong, higher-scored 7
    assert n1["generator_tokens_per_problem"] == (13 + 17) / 2 and n1["verifier_tokens_per_problem"] == (20 + 30) / 2
    assert n2["tokens_per_problem"] == (173 + 96) / 2 and n1["apportioned_rows"] == 0
    # the same rows without the records: the fallback splits the totals, named as such
    old = [_bon_row("a", ["5", "7"], [0.2, 0.9], [(10, 3, 20), (10, 40, 90)], records=False), rows[1]]
    o1, o2 = curves.sample_curve(old, "best_of_n", [1, 2], PROBLEMS)
    assert o1["apportioned_rows"] == 1 and o2["tokens_per_problem"] == pytest.approx(n2["tokens_per_problem"])
    assert o1["tokens_per_problem"] != n1["tokens_per_problem"]
    sources = curves.token_sources({"sft": {"best_of_n": [o1, o2]}})
    assert sources["sample_curves"].startswith("apportioned") and "sft/best_of_n (1 rows)" in sources["sample_curves"]
    assert curves.token_sources({"sft": {"best_of_n": [n1, n2]}})["sample_curves"].startswith("read")


def test_self_consistency_curve_reads_each_samples_tokens():
    row = {"id": "a", "question": PROBLEMS["a"].question, "usage": {"prompt_tokens": 30, "completion_tokens": 17},
           "trace": {"samples": ["x", "y", "z"], "answers": ["4", "5", "5"], "prompt_tokens": [10, 10, 10],
                     "completion_tokens": [2, 5, 10]}}
    n1, n2 = curves.sample_curve([row], "self_consistency", [1, 2], PROBLEMS)
    assert (n1["accuracy"], n1["tokens_per_problem"]) == (0.0, 12)
    assert (n2["accuracy"], n2["tokens_per_problem"]) == (0.0, 27)  # a 1-1 tie goes to the first answer
    assert curves.sample_curve([row], "self_consistency", [4], PROBLEMS) == []  # N beyond the run


def test_stepco_curve_reads_each_rounds_tokens():
    rounds = [{"round": 0, "steps": ["so 7", "<ans>7</ans>"], "scores": [0.1, 0.1], "prompt_tokens": 10,
               "completion_tokens": 4, "verifier_tokens": 15},
              {"round": 1, "steps": ["so 5", "<ans>5</ans>"], "scores": [0.9, 0.9], "revised_index": 1,
               "prompt_tokens": 30, "completion_tokens": 4, "verifier_tokens": 16}]
    row = {"id": "a", "question": PROBLEMS["a"].question, "prediction": "5", "correct": True,
           "usage": _usage(rounds), "trace": {"rounds": rounds, "revision": "prompt", "revisions": 1}}
    t1, t2 = curves.stepco_curve([row], 2, PROBLEMS)
    assert t1["accuracy"] == t2["accuracy"] == 1.0 and t1["tokens_per_problem"] == 79 == t2["tokens_per_problem"]
    assert t1["apportioned_rows"] == 0
    zero = curves.stepco_curve([row], 1, PROBLEMS)[0]
    assert zero["tokens_per_problem"] == 79  # round 0 and round 1 (T=1 is one revision)
    first = dict(row, trace={"rounds": rounds[:1], "revision": "prompt"}, prediction="7", correct=False,
                 usage=_usage(rounds[:1]))
    assert curves.stepco_curve([first], 1, PROBLEMS)[0]["tokens_per_problem"] == 29
    old = dict(row, trace={"rounds": [{k: v for k, v in r.items() if not k.endswith("_tokens")} for r in rounds],
                           "revision": "prompt"})
    (a,) = curves.stepco_curve([old], 1, PROBLEMS)
    assert a["apportioned_rows"] == 1 and a["tokens_per_problem"] == pytest.approx(79)
    changes = analysis.answer_changes([row], PROBLEMS)
    assert changes["incorrect_to_correct"] == 1 and changes["revised"] == 1 and changes["net_gain"] == 1


# ----------------------------------------------------------------------------------------------
# report and plot from given rows


def _cell(accuracy, tokens):
    return analysis.cell_record({
        "n": 2, "correct": int(accuracy * 2), "accuracy": accuracy, "accuracy_ci95": [0.0, 1.0],
        "generator_prompt_tokens": tokens // 2, "generator_completion_tokens": tokens // 2, "verifier_tokens": 0,
        "total_tokens": tokens, "llm_calls": 2, "verifier_calls": 0, "wall_seconds": 1.0, "method_seconds": 0.5,
        "load_seconds": 0.5, "no_prediction": 0})


def test_report_and_plot_render_from_given_rows(tmp_path):
    cfg = config.load_config(None, sets=["policies=[sft]", "eval.methods={greedy: {}, best_of_n: {n: 2}}",
                                         "eval.threshold_dev_problems=null"])
    table = {"sft": {"greedy": _cell(0.5, 40), "best_of_n": _cell(1.0, 200)}}
    rows = {"sft": {"greedy": [{"id": "a", "correct": False}, {"id": "b", "correct": True}],
                    "best_of_n": [{"id": "a", "correct": True}, {"id": "b", "correct": True}]}}
    crv = {"sft": {"best_of_n": [{"n": 1, "accuracy": 0.5, "tokens_per_problem": 60.0, "apportioned_rows": 0},
                                 {"n": 2, "accuracy": 1.0, "tokens_per_problem": 100.0, "apportioned_rows": 0}]}}
    summary = {"n_problems": 2, "problems_fingerprint": "f", "verifier": "psv", "total_wall_seconds": 3.0,
               "stage_seconds": {"report": 1.0}, "artefacts": {}, "table": table,
               "effects": analysis.effects(cfg, rows), "answer_changes": {}, "curves": crv,
               "token_sources": curves.token_sources(crv), "command": "python scripts/compare.py --out x"}
    report.write_report(tmp_path / "report.md", summary, cfg)
    text = (tmp_path / "report.md").read_text()
    assert "| SFT | Best-of-N | 1.000 | [0.000, 1.000] |" in text
    assert "N=1: 0.500 @ 60; N=2: 1.000 @ 100" in text and "Apportioned tokens" not in text
    assert "python scripts/compare.py --out x" in text
    assert "one training seed" not in text  # no PPO policy, no PPO budget line
    budget = {"max_steps": 2, "prompts_per_update": 1, "num_generations": 2, "responses": 4, "n_prompts": 8,
              "dataset": "world", "max_completion_length": 16, "seed": 0}
    report.write_report(tmp_path / "report.md", {**summary, "ppo_budget": budget}, cfg)
    assert "Each PPO row is **one training seed**" in (tmp_path / "report.md").read_text()
    with_runs = config.load_config(None,
                                   sets=["eval.methods={greedy: {}, best_of_n: {n: 2}}",
                                         "eval.threshold_dev_problems=null"])
    report.write_report(tmp_path / "report.md", {**summary, "ppo_budget": budget}, with_runs)
    text = (tmp_path / "report.md").read_text()
    assert f"step-PPO: {report.run_reward(with_runs, 'step_ppo')}" in text
    assert "in docs/results/mc_values_world.md" in text
    plot.plot(tmp_path / "fig.png", cfg, crv, table)
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_names_each_ppo_runs_reward_and_links_its_seeds_page():
    cfg = config.load_config(None)
    assert report.run_reward(cfg, "outcome_ppo") == ("the answer check (1 right, 0 wrong) at the last token, "
                                                    "group advantages (no verifier)")
    assert report.run_reward(cfg, "step_ppo").startswith(
        "the answer check (1 right, 0 wrong) at the last token, credited to steps by Monte Carlo values "
        "(4 continuations")
    paid = config.load_config(None,
                              sets=["ppo.runs.step_ppo.reward=step",
                                    "ppo.runs.step_ppo.args.advantage_estimator=group"])
    assert report.run_reward(paid, "step_ppo") == "the verifier's score of each step at its end, group advantages"
    assert cfg.ppo.seeds_page == "docs/results/mc_values_world.md" and (config.ROOT / cfg.ppo.seeds_page).is_file()


def _greedy_report(tmp_path, table, artefacts) -> str:
    """The report of a one-policy, greedy-only comparison with these cells and artefacts."""
    cfg = config.load_config(None, sets=["policies=[sft]", "eval.methods={greedy: {}}",
                                         "eval.threshold_dev_problems=null"])
    summary = {"n_problems": 2, "problems_fingerprint": "f", "verifier": "psv", "total_wall_seconds": 1.0,
               "stage_seconds": {"report": 1.0}, "artefacts": artefacts, "table": table,
               "effects": analysis.effects(cfg, {"sft": {"greedy": [{"id": "a", "correct": True}]}}),
               "answer_changes": {}, "curves": {}, "token_sources": {}, "command": "python scripts/compare.py"}
    report.write_report(tmp_path / "report.md", summary, cfg)
    return (tmp_path / "report.md").read_text()


def test_a_resumed_comparison_reports_the_time_its_results_took_not_only_its_own(tmp_path):
    """Resumed with every artefact and cell done, a comparison runs for a second; its report used to
    say "Total wall time 1 s" of results that took minutes."""
    table = {"sft": {"greedy": _cell(0.5, 40)}}
    artefacts = {"sft": {"status": "cached", "spec": "outputs/sft", "dir": "d", "seconds": 480.0, "info": {}},
                 "ppo": {"status": "cached", "spec": "outputs/ppo", "dir": "e", "seconds": 5.3, "info": {}}}
    assert analysis.recorded_seconds(artefacts, table) == 486.3
    text = _greedy_report(tmp_path, table, artefacts)
    assert "Wall time of this invocation 1 s" in text and "took 486 s to build and run" in text
    assert "Prompts beyond" not in text


def test_the_report_counts_prompts_beyond_the_context_in_cells_ppo_and_annotation(tmp_path):
    table = {"sft": {"greedy": {**_cell(0.5, 40), "prompt_too_long": 1}}}
    artefacts = {"ppo": {"status": "built", "spec": "p", "dir": "p", "seconds": 5.0,
                         "info": {"prompt_too_long": {"train": 2, "eval": 0, "probe": 0}}},
                 "psv": {"status": "built", "spec": "v", "dir": "v", "seconds": 9.0,
                         "info": {"annotation": {"prompt_too_long": 3}}}}
    text = _greedy_report(tmp_path, table, artefacts)
    assert ("**Prompts beyond the model's context** (`prompt_too_long`, never run): SFT greedy: 1 problems counted "
            "wrong; ppo: 2 train prompts left out of PPO; psv: 3 problems left out of the annotation.") in text


def test_side_by_side_jobs_get_one_thread_each_whatever_the_parent_has(tmp_path):
    """Jobs run side by side as subprocesses with the OMP_NUM_THREADS they ask for, not the parent's
    (inside the SFT stage the parent holds every core: two 2-thread trainings on 2 cores crawl)."""
    import sys

    from compare.jobs import Job, run_jobs
    from reasoning.threads import torch_threads

    show = [sys.executable, "-c", "import os; print('omp=' + os.environ['OMP_NUM_THREADS'])"]
    jobs = [Job(name=f"j{i}", inline=lambda: None, command=show, threads=1) for i in range(2)]
    jobs.append(Job(name="inherit", inline=lambda: None, command=show))
    with torch_threads(2):
        run_jobs(jobs, 2, tmp_path)
    assert [(tmp_path / f"{n}.log").read_text().count("omp=1") for n in ("j0", "j1")] == [1, 1]
    assert "omp=2" in (tmp_path / "inherit.log").read_text()  # no `threads`: the parent's setting


def test_ppo_progress_reads_the_update_reward_and_probe_from_the_metrics(tmp_path):
    """The heartbeat's line for a PPO run: the last logged update out of the run's total, its rollout
    accuracy and reward, and the probe's latest greedy accuracy beside its first; a half-written last
    line is skipped; no metrics yet gives None (the heartbeat then shows the log's last line)."""
    import json

    from compare.train import ppo_progress

    path = tmp_path / "metrics.jsonl"
    assert ppo_progress(path, 120) is None
    rows = [{"update": 0, "probe/greedy_accuracy": 0.45, "elapsed": 0.0},
            {"update": 10, "rollout/accuracy": 0.40625, "reward/mean_total": 0.39453125,
             "probe/greedy_accuracy": 0.47, "elapsed": 180.4},
            {"update": 11, "rollout/accuracy": 0.4375, "reward/mean_total": 0.421875, "elapsed": 199.6}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"update": 12, "rollout/acc')
    assert ppo_progress(path, 120) == ("update 11/120, rollout accuracy 0.44, reward 0.422, probe greedy 0.47 "
                                      "(update 10; 0.45 at the start), 200 s of training")
    assert ppo_progress(path, None).startswith("update 11, ")
    path.write_text(json.dumps(rows[0]) + "\n")
    assert ppo_progress(path, 120) == "update 0/120, probe greedy 0.45 (update 0; 0.45 at the start), 0 s of training"


def test_heartbeat_shows_a_jobs_progress_and_falls_back_to_its_log(tmp_path, capsys):
    """While side-by-side jobs run, each heartbeat line names the job and says its progress where
    the job has a reader, the last line of its log where it has none or the reader fails."""
    import sys

    from compare.jobs import Job, run_jobs

    def broken():
        raise ValueError("half-written metrics")

    talk = [sys.executable, "-c", "import time; print('loading the policy', flush=True); time.sleep(1.5)"]
    jobs = [Job(name="ppo_a", inline=lambda: None, command=talk, progress=lambda: "update 3/120"),
            Job(name="ppo_b", inline=lambda: None, command=talk, progress=broken),
            Job(name="eval_c", inline=lambda: None, command=talk)]
    run_jobs(jobs, 3, tmp_path, heartbeat=0.5)
    err = capsys.readouterr().err
    assert "ppo_a: update 3/120" in err
    assert "ppo_b: loading the policy" in err
    assert "eval_c: loading the policy" in err
    assert "ppo_a: loading the policy" not in err


def test_a_revision_loop_left_to_auto_is_refused_by_compare():
    """StepCo's and PathCo's `auto` settings are chosen by the evaluation CLI; a compare recipe gives them."""
    with pytest.raises(config.CompareError, match="eval.methods.pathco: give revision"):
        config.load_config(None, sets=["eval.methods.pathco.max_rounds=2"])
    assert config.load_config(None, sets=["eval.methods.pathco.revision=resample"]).eval.methods["pathco"]
