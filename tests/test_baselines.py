"""The baselines trained beside PPO (rl/baselines/grpo_peer.py: TRL's GRPOTrainer on the gold reward;
rl/baselines/rft.py: rejection-sampling fine-tuning): their settings are a PPO run's, with the PPO run's defaults."""

import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest

from rl.baselines import grpo_peer, rft
from rl.ppo_config import StepPPOConfig

ROOT = Path(__file__).resolve().parents[1]
BASELINES = {"grpo_peer": grpo_peer, "rft": rft}


def _policy(tmp_path: Path) -> str:
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    return str(tmp_path / "policy")


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_take_the_ppo_runs_defaults(name, tmp_path):
    module = BASELINES[name]
    ppo = {f.name for f in fields(StepPPOConfig)}
    assert module.USES <= ppo, sorted(module.USES - ppo)
    args, _ = module.parse(["--model_name_or_path", _policy(tmp_path), "--output_dir", str(tmp_path / "out")])
    default = StepPPOConfig()
    own_defaults = getattr(module, "DEFAULTS", {})
    for field_name in sorted(module.USES - {"model_name_or_path", "output_dir"}):
        expected = own_defaults.get(field_name, getattr(default, field_name))
        assert getattr(args, field_name) == expected, field_name
    # no argparse of its own: a default written in the module is one of its DEFAULTS or its own dataclass's
    tree = ast.parse((ROOT / "rl" / f"{name}.py").read_text())
    calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert "add_argument" not in calls and "ArgumentParser" not in calls


def test_rft_samples_a_ppo_runs_prompts(tmp_path):
    args, own = rft.parse(["--model_name_or_path", _policy(tmp_path), "--output_dir", str(tmp_path / "out"),
                           "--max_steps", "3", "--prompts_per_update", "5", "--accept", "answer"])
    assert rft.n_prompts(args) == 15 and own.accept == "answer" and own.epochs == 1.0
    default, _ = rft.parse(["--model_name_or_path", str(tmp_path / "policy"), "--output_dir", str(tmp_path / "out")])
    assert rft.n_prompts(default) == 120 * 16  # a PPO run's 120 updates x 16 prompts
    assert default.answer_match == "strict"  # RFT keeps what PPO's gold reward pays: the same check
    flexible, _ = rft.parse(["--model_name_or_path", str(tmp_path / "policy"), "--output_dir", str(tmp_path / "out"),
                             "--answer_match", "flexible"])
    assert flexible.answer_match == "flexible"


@pytest.mark.parametrize(("name", "flags", "message"), [
    ("grpo_peer", ["--reward", "step"],
     "error: rl.baselines.grpo_peer does not use --reward (a PPO setting); it takes"),
    ("grpo_peer", ["--no_chat_template"], "error: rl.baselines.grpo_peer does not use --chat_template (a PPO setting)"),
    ("rft", ["--kl_coef", "0.1"], "error: rl.baselines.rft does not use --kl_coef (a PPO setting); it takes --accept"),
    ("rft", ["--n_prompts", "100"], "error: --max_steps x --prompts_per_update (1920 prompts) is more than "
                                    "--n_prompts (100): lower the one or raise the other"),
    ("grpo_peer", ["--config", "recipe.yaml"], "error: rl.baselines.grpo_peer takes flags, not --config"),
    ("grpo_peer", ["--samples_per_prompt", "1"], "error: --samples_per_prompt must be >= 2 (GRPO compares"),
])
def test_baselines_refuse_what_they_would_ignore(name, flags, message, tmp_path, capsys):
    code = BASELINES[name].main(["--model_name_or_path", _policy(tmp_path), "--output_dir", str(tmp_path / "out"),
                                 *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_need_their_output_folder_and_a_policy(name, tmp_path, capsys):
    assert BASELINES[name].main(["--model_name_or_path", _policy(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: rl.baselines.{name} needs --output_dir\n"
    assert BASELINES[name].main(["--output_dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"error: rl.baselines.{name} needs --model_name_or_path\n"
    assert BASELINES[name].main(["--model_name_or_path", str(tmp_path / "none"), "--output_dir",
                                 str(tmp_path / "o")]) == 2
    assert "no model there (config.json missing)" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_take_the_ppo_runs_thread_count(name, tmp_path, monkeypatch):
    """--num_threads N sets a baseline's torch threads as it does a PPO run's beside it; 0 leaves one
    thread unless OMP_NUM_THREADS says more."""
    import torch

    from reasoning.threads import threads_for_baseline

    args, _ = BASELINES[name].parse(["--model_name_or_path", _policy(tmp_path), "--output_dir",
                                     str(tmp_path / "out"), "--num_threads", "2"])
    assert args.num_threads == 2
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        threads_for_baseline(args.num_threads)
        assert torch.get_num_threads() == 2
        threads_for_baseline(0)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_take_the_earlier_flag_names_as_the_ppo_run_does(name, tmp_path, capsys):
    args, _ = BASELINES[name].parse(["--policy", _policy(tmp_path), "--output_dir", str(tmp_path / "out"),
                                     "--num_updates", "3", "--samples_per_prompt", "4",
                                     "--max_new_tokens", "16"])
    assert (args.model_name_or_path, args.max_steps, args.num_generations, args.max_completion_length) == (
        str(tmp_path / "policy"), 3, 4, 16)
    err = capsys.readouterr().err
    for old, new in [("policy", "model_name_or_path"), ("num_updates", "max_steps"),
                     ("samples_per_prompt", "num_generations"), ("max_new_tokens", "max_completion_length")]:
        assert f"warning: --{old} is deprecated: use --{new}" in err, err
    # an unknown flag's closest match is one the baseline takes, under its current name
    assert BASELINES[name].main(["--policy", str(tmp_path / "policy"), "--output_dir", str(tmp_path / "o"),
                                 "--samples_per_promt", "4"]) == 2
    assert capsys.readouterr().err == "error: unknown flag --samples_per_promt; did you mean --num_generations?\n"


@pytest.mark.slow
def test_grpo_peer_writes_the_run_folder_the_rl_comparison_reads(tmp_path, capsys):
    from tiny_world_policy import save_tiny_world_policy

    policy = save_tiny_world_policy(tmp_path / "policy")
    out = tmp_path / "gold_s0"
    code = grpo_peer.main(["--policy", str(policy), "--output_dir", str(out), "--num_updates", "1",
                           "--prompts_per_update", "2", "--samples_per_prompt", "2", "--num_mini_batches", "1",
                           "--ppo_epochs", "1", "--max_new_tokens", "8", "--n_prompts", "4", "--n_eval", "3",
                           "--n_probe", "2", "--probe_every", "1", "--bootstrap_resamples", "20"])
    assert code == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["peer"] == "trl.GRPOTrainer" and result["updates"] == 1 and result["responses_per_update"] == 4
    assert len((out / "eval_before_rows.jsonl").read_text().splitlines()) == 3
    assert len((out / "eval_after_rows.jsonl").read_text().splitlines()) == 3
    probes = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [p["update"] for p in probes] == [0, 1] and all("probe/greedy_accuracy" in p for p in probes)
    from scripts.rl_comparison import main as comparison

    assert comparison([str(out), "--out", str(tmp_path / "comparison"), "--resamples", "20"]) == 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| gold | 1 |" in table


def test_rft_keeps_what_the_verifier_scores_and_counts_a_path_it_refuses():
    """A path the verifier refuses (here: too long for it) is not kept and is counted by reason; the
    other samples are still judged, in batches."""
    from reward_models.verifier import VerifierInputError

    class Verifier:
        calls = 0

        def score(self, questions, paths):
            self.calls += 1
            if any(len(p) > 3 for p in paths):
                raise VerifierInputError("a path longer than the verifier's context")
            return [[0.1 if "bad" in s else 0.9 for s in p] for p in paths]

    samples = [("q1", "good step.\nThe answer is 1."),
               ("q2", "good step.\nbad step.\nThe answer is 2."),
               ("q3", "good.\ngood.\ngood.\ngood.\nThe answer is 3."),  # five steps: refused
               ("q4", "good step without an answer"),
               ("q5", "good step.\ngood step.\nThe answer is 5.")]
    verifier = Verifier()
    accept, unscorable = rft.verifier_accepts(verifier, samples, threshold=0.5)
    assert unscorable == {"too_long": 1}
    assert [i for i, ok in enumerate(accept) if ok] == [0, 4]  # q2 has a low step, q4 no answer
    assert verifier.calls == 1 + 4  # the batch of the 4 answered paths, then each alone after the refusal
    verifier = Verifier()
    accept, unscorable = rft.verifier_accepts(verifier, samples[:2] + samples[3:], threshold=0.5)
    assert (accept, dict(unscorable), verifier.calls) == ([True, False, False, True], {}, 1)
