"""experiments.metrics_plot: curves read from metrics.jsonl update lines, a bad run or key refused."""

import json

from experiments import metrics_plot


def _run(tmp_path, name, rows):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_curves_take_update_lines_only_and_the_figure_is_written(tmp_path):
    rows = [{"update": 0, "probe/greedy_accuracy": 0.4},  # a probe-only line: no time/update
            {"update": 1, "time/update": 2.0, "rollout/accuracy": 0.25},
            {"update": 2, "time/update": 2.0, "rollout/accuracy": 0.5, "objective/kl": 0.1}]
    run = _run(tmp_path, "seed0", rows)
    got = metrics_plot.curves(run, ["rollout/accuracy", "objective/kl"])
    assert got == {"rollout/accuracy": ([1, 2], [0.25, 0.5]), "objective/kl": ([2], [0.1])}
    out = tmp_path / "fig" / "curves.png"
    assert metrics_plot.main([str(run), "--metrics", "rollout/accuracy,objective/kl", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curves_against_the_tokens_sampled_so_far(tmp_path, capsys):
    rows = [{"update": 1, "time/update": 2.0, "rollout/tokens_cumulative": 100.0, "rollout/accuracy": 0.25},
            {"update": 2, "time/update": 2.0, "rollout/tokens_cumulative": 250.0, "rollout/accuracy": 0.5},
            {"update": 3, "time/update": 2.0, "rollout/accuracy": 0.75}]  # a run from before the metric: skipped
    run = _run(tmp_path, "seed0", rows)
    assert metrics_plot.curves(run, ["rollout/accuracy"], "rollout/tokens_cumulative") == {
        "rollout/accuracy": ([100.0, 250.0], [0.25, 0.5])}
    out = tmp_path / "tokens.png"
    assert metrics_plot.main([str(run), "--metrics", "rollout/accuracy", "--x", "rollout/tokens_cumulative",
                              "--out", str(out)]) == 0
    old = _run(tmp_path, "old", rows[2:])
    assert metrics_plot.main([str(old), "--metrics", "rollout/accuracy", "--x", "rollout/tokens_cumulative",
                              "--out", str(tmp_path / "old.png")]) == 2
    assert "beside --x 'rollout/tokens_cumulative'" in capsys.readouterr().err


def test_a_missing_run_or_a_key_no_run_logs_is_refused(tmp_path, capsys):
    run = _run(tmp_path, "seed0", [{"update": 1, "time/update": 1.0, "rollout/accuracy": 0.1}])
    out = tmp_path / "x.png"
    assert metrics_plot.main([str(tmp_path / "absent"), "--metrics", "rollout/accuracy", "--out", str(out)]) == 2
    assert "absent/metrics.jsonl: no such file" in capsys.readouterr().err
    assert metrics_plot.main([str(run), "--metrics", "rollout/acuracy", "--out", str(out)]) == 2
    assert "no run logs 'rollout/acuracy'" in capsys.readouterr().err
    assert not out.exists()
