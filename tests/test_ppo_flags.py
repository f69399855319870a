"""PPO's flags: inherited `TrainingArguments` flags work or are refused, `--report_to` is checked
first, a typo gets the closest name; checkpoints hold a policy that `from_pretrained` loads and a
`TrainerState` trainer_state.json; `--push_to_hub` pushes each checkpoint and the final policy."""

import json

import pytest

from rl import ppo_step
from rl.ppo_cli import parse_config
from rl.ppo_config import ConfigError


@pytest.mark.parametrize("flags, message", [
    (["--per_device_train_batch_size", "8"], "--per_device_train_batch_size is a TrainingArguments flag that step "
                                             "PPO does not use: use --prompts_per_update"),
    (["--gradient_accumulation_steps", "4"], "use --num_mini_batches"),
    (["--num_train_epochs", "3"], "use --max_steps"),
    (["--optim", "sgd"], "step PPO uses AdamW"),
    (["--torch_compile", "true"], "--torch_compile is a TrainingArguments flag that step PPO does not use: remove it"),
    (["--rewrad", "step"], "unknown flag --rewrad; did you mean --reward?"),
    (["--report_to", "wandbb"], "--report_to wandbb: not a tracker (one of none, all, wandb"),
])
def test_flags_that_would_do_nothing_are_refused_in_one_line_before_anything_runs(flags, message, tmp_path, capsys,
                                                                                  monkeypatch):
    import rl.build_defaults
    import rl.ppo_setup

    def nothing(*args, **kwargs):
        raise AssertionError("the run started before its flags were checked")

    monkeypatch.setattr(rl.build_defaults, "ensure_default_models", nothing)  # the 8-minute default build
    monkeypatch.setattr(rl.ppo_setup, "check_inputs", nothing)
    code = ppo_step.main(["--output_dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and err.startswith("error: "), err


def test_a_recipe_key_typo_names_the_closest_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kl_cof: 0.1\n")
    with pytest.raises(ConfigError, match=r"Unknown arguments from config file: \['--kl_cof', '0.1'\]; did you mean "
                                          r"--beta\?"):
        parse_config(["--config", str(recipe)])
    recipe.write_text("optim: adafactor\n")
    with pytest.raises(ConfigError, match="--optim is a TrainingArguments flag"):
        parse_config(["--config", str(recipe)])


def test_a_tracker_that_is_not_installed_is_refused(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"--report_to wandb: wandb is not installed \(pip install wandb"):
        parse_config(["--report_to", "wandb"])


EARLIER = [("--policy", "p", "model_name_or_path", "p"), ("--num_updates", "7", "max_steps", 7),
           ("--samples_per_prompt", "4", "num_generations", 4), ("--max_new_tokens", "64", "max_completion_length", 64),
           ("--ppo_epochs", "3", "num_iterations", 3), ("--cliprange", "0.1", "epsilon", 0.1),
           ("--kl_coef", "0.5", "beta", 0.5), ("--rollout_backend", "vllm", "use_vllm", True)]


@pytest.mark.parametrize("flag, value, field, parsed", EARLIER)
def test_trl_names_are_the_fields_and_the_earlier_names_still_work(flag, value, field, parsed, capsys):
    new = parse_config([f"--{field}", "true" if parsed is True else value])
    assert getattr(new, field) == parsed and capsys.readouterr().err == ""
    old = parse_config([flag, value])
    assert getattr(old, field) == parsed
    assert not hasattr(old, flag[2:])  # translated at the edge: the config holds TRL's names only
    assert capsys.readouterr().err == f"warning: {flag} is deprecated: use --{field} (TRL's name)\n"
    assert parse_config([f"{flag}={value}"]).__getattribute__(field) == parsed


def test_earlier_names_in_recipes_and_stored_runs(tmp_path, capsys):
    from rl.ppo_config import StepPPOConfig
    from rl.setting_names import translate_settings

    recipe = tmp_path / "old.yaml"
    recipe.write_text("num_updates: 5\nkl_coef: 0.3\nrollout_backend: hf\n")
    cfg = parse_config(["--config", str(recipe)])
    assert (cfg.max_steps, cfg.beta, cfg.use_vllm) == (5, 0.3, False)
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {recipe}: {k} is deprecated: use {n} (TRL's name)"
                   for k, n in (("num_updates", "max_steps"), ("kl_coef", "beta"), ("rollout_backend", "use_vllm"))]
    recipe.write_text("num_updates: 5\nmax_steps: 6\n")
    with pytest.raises(ConfigError, match="num_updates and max_steps are the same setting"):
        parse_config(["--config", str(recipe)])
    with pytest.raises(TypeError):  # in Python, the config takes TRL's names only
        StepPPOConfig(output_dir="x", samples_per_prompt=4, report_to="none")
    assert translate_settings({"policy": "p", "rollout_backend": "hf"}) == {"model_name_or_path": "p",
                                                                        "use_vllm": False}
    assert parse_config(["--no_chat_template"]).chat_template is False
    with pytest.raises(ConfigError, match="did you mean --num_generations"):
        parse_config(["--samples_per_promt", "2"])


class _FakeHub:
    calls: list = []

    def __init__(self, token=None):
        pass

    def create_repo(self, repo_id, **kwargs):
        _FakeHub.calls.append(("create", repo_id))
        return type("Repo", (), {"repo_id": f"someone/{repo_id}"})()

    def upload_folder(self, repo_id, folder_path, path_in_repo=None, **kwargs):
        from pathlib import Path

        _FakeHub.calls.append(("upload", repo_id, path_in_repo, sorted(p.name for p in Path(folder_path).iterdir())))


def test_logging_steps_checkpoints_that_load_and_push_to_hub(tmp_path, monkeypatch):
    import huggingface_hub
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerState

    from tests.tiny_world_policy import save_tiny_world_policy

    policy = save_tiny_world_policy(tmp_path / "policy")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeHub)
    _FakeHub.calls = []
    out = tmp_path / "run"
    argv = ["--model_name_or_path", str(policy), "--reward", "gold", "--build_missing", "false", "--max_steps", "3",
            "--prompts_per_update", "2", "--num_generations", "2", "--num_mini_batches", "1", "--n_prompts", "8",
            "--eval_dataset", "none", "--n_probe", "0", "--max_completion_length", "8", "--save_steps", "2",
            "--logging_steps", "2", "--num_threads", "1", "--disable_tqdm", "true", "--report_to", "none",
            "--output_dir", str(out), "--push_to_hub", "true", "--hub_model_id", "tiny-ppo"]
    assert ppo_step.main(argv) == 0
    # logging_steps 2 over 3 updates: update 2 and the last one
    assert [json.loads(line)["update"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [2, 3]
    ckpt = out / "checkpoint-2"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    assert AutoTokenizer.from_pretrained(ckpt / "policy") is not None and model.config.vocab_size > 0
    assert (ckpt / "policy" / "world_config.json").exists()
    state = TrainerState.load_from_json(str(ckpt / "trainer_state.json"))
    assert state.global_step == 2 and state.max_steps == 3 and [r["step"] for r in state.log_history] == [2]
    uploads = [c for c in _FakeHub.calls if c[0] == "upload"]
    assert [(c[1], c[2]) for c in uploads] == [("someone/tiny-ppo", "checkpoint-2"),
                                               ("someone/tiny-ppo", "checkpoint-3"), ("someone/tiny-ppo", None)]
    assert "model.safetensors" in uploads[0][3] and "config.json" in uploads[-1][3]
    # the accelerate state beside it still resumes
    more = [a if a != "3" else "4" for a in argv]
    assert ppo_step.main([*more, "--resume_from_checkpoint", "auto"]) == 0
    assert json.loads((out / "eval.json").read_text())["updates"] == 4


def test_help_lists_the_toolkits_flags_first_and_leaves_out_refused_ones(capsys):
    from rl.tools import checkpoint_curve

    with pytest.raises(SystemExit) as info:
        ppo_step.main(["--help"])
    text = capsys.readouterr().out
    assert info.value.code == 0
    own = text.index("step PPO (rl/ppo_config.py")
    inherited = text.index("inherited from transformers.TrainingArguments")
    assert own < text.index("  --model_name_or_path") < text.index("  --beta") < inherited
    assert inherited < text.index("  --push_to_hub") and inherited < text.index("  --gradient_checkpointing")
    assert "--per_device_train_batch_size" not in text and "--optim " not in text
    assert text[:own].count("\n") < 100
    assert checkpoint_curve.main(["--help"]) == 0
    short = capsys.readouterr().out
    assert "--output_dir RUN" in short and "--temperature" in short and short.count("\n") < 40


def test_an_error_names_an_earlier_name_as_the_user_wrote_it_and_alone(tmp_path, capsys):
    code = ppo_step.main(["--output_dir", str(tmp_path / "run"), "--samples_per_prompt", "1",
                          "--advantage_estimator", "group"])
    err = capsys.readouterr().err
    assert code == 2 and err == "error: --advantage_estimator group needs --samples_per_prompt >= 2\n", err
    code = ppo_step.main(["--output_dir", str(tmp_path / "run"), "--policy", str(tmp_path / "absent")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --policy ") and err.count("\n") == 1, err


def test_stored_runs_and_compare_configs_with_earlier_names_are_translated_at_the_edge(tmp_path, capsys):
    """A run folder or a checkpoint written before the settings took TRL's names, and a compare
    config that still uses the earlier names, are read under TRL's names (a compare config with a
    deprecation line, a stored folder silently); the two names of one setting are refused."""
    import json

    from compare.config import CompareError, load_config
    from rl.run_dir import RESUME_STATE, RunDir, stored_settings

    (tmp_path / "run_config.json").write_text(json.dumps({"policy": "p", "num_updates": 3, "kl_coef": 0.1}))
    assert stored_settings(tmp_path) == {"model_name_or_path": "p", "max_steps": 3, "beta": 0.1}
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    (ckpt / RESUME_STATE).write_text(json.dumps({"update": 3, "kl_coef": 0.25}))
    assert RunDir.resume_state(ckpt) == {"update": 3, "beta": 0.25}
    capsys.readouterr()
    cfg = load_config(None, sets=["ppo.args.kl_coef=0.5"])
    assert cfg.ppo.args["beta"] == 0.5 and "kl_coef" not in cfg.ppo.args
    assert capsys.readouterr().err == "warning: --set ppo.args.kl_coef is deprecated: use beta (TRL's name)\n"
    with pytest.raises(CompareError, match="kl_coef and beta are the same setting"):
        load_config(None, overrides={"ppo": {"args": {"kl_coef": 0.5, "beta": 0.1}}})
