"""The step-level PPO trainer end to end on tiny models: rewards on step tokens, reward modes, LoRA,
checkpoints and resume, NaN batches, the outputs of `rl/ppo_step.py`, and 2 processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, generate
from rl import ppo_step
from rl.ppo_config import StepPPOConfig

ROOT = Path(__file__).resolve().parents[1]
WORLD = WorldConfig(min_steps=1, max_steps=2)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny policy (tokenizer trained on world text) and a PSV initialised from it, saved offline."""
    from reasoning.tokenizer import train_tokenizer
    from reward_models.psv import init_psv_from_policy
    from rl.models import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("ppo_models")
    policy = root / "policy"
    rows = generate("train", 200, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    model.save_pretrained(policy)
    tok.save_pretrained(policy)
    (policy / "world_config.json").write_text(json.dumps(WORLD.__dict__))
    psv, psv_tok = init_psv_from_policy(str(policy))
    psv.save_pretrained(root / "psv")
    psv_tok.save_pretrained(root / "psv")
    (root / "psv" / "psv_config.json").write_text(json.dumps({"init_from": str(policy)}))
    return root


def tiny_args(models, out, *extra):
    # the step reward and a critic (GAE), as these tests were written for; a flag in `extra` overrides
    return ["--reward", "step", "--advantage_estimator", "gae",
            "--policy", str(models / "policy"), "--verifier", str(models / "psv"), "--output_dir", str(out),
            "--build_missing", "false", "--num_updates", "2", "--prompts_per_update", "4", "--samples_per_prompt", "2",
            "--n_prompts", "16", "--n_eval", "6", "--max_new_tokens", "24", "--num_mini_batches", "2",
            "--ppo_epochs", "1", "--save_steps", "1", "--disable_tqdm", "true", "--learning_rate", "1e-3",
            "--num_threads", "1", "--n_probe", "4", "--probe_every", "1", *extra]


class FixedVerifier:
    """Scores step k of every path as `scores[k]`."""

    def __init__(self, scores):
        self.scores = scores
        self.tokens_used = 0

    def score(self, questions, paths):
        return [[self.scores[k % len(self.scores)] for k in range(len(p))] for p in paths]


def make_trainer(models, tmp_path, verifier, reward_funcs=None, reward_weights=None, **overrides):
    from rl.ppo_setup import load_critic, load_policy, load_problems
    from rl.ppo_trainer import StepPPOTrainer

    fields = dict(output_dir=str(tmp_path / "run"), model_name_or_path=str(models / "policy"),
                  verifier=str(models / "psv"),
                  build_missing=False, n_prompts=8, n_eval=4, prompts_per_update=2, num_generations=2,
                  max_completion_length=16, num_mini_batches=2, report_to="none", disable_tqdm=True,
                  critic_warmup_updates=0, reward="step", advantage_estimator="gae")
    fields.update(overrides)
    args = StepPPOConfig(**fields)
    train, _ = load_problems("world", args.n_prompts, args, "train")
    policy, tok = load_policy(args)
    critic = load_critic(args, tok)
    return (StepPPOTrainer(args, policy, tok, critic, verifier, train, [], reward_funcs=reward_funcs,
                           reward_weights=reward_weights), tok, train)


def rollouts_from_texts(trainer, tok, problems, texts, eos=True):
    """A Rollouts batch whose responses are exactly `texts` (tokenised by the policy's tokenizer)."""
    from rl.batches import Rollouts

    tok.padding_side = "left"
    enc = tok([solve_prompt(p.question) for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
    ids = [tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else []) for t in texts]
    width = max(len(i) for i in ids)
    response = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros((len(ids), width))
    for k, row in enumerate(ids):
        response[k, : len(row)] = torch.tensor(row)
        mask[k, : len(row)] = 1
    return Rollouts(enc["input_ids"], enc["attention_mask"], response, mask, list(texts), list(problems)), ids


def close_tag_token(tok, text, nth):
    """Index of the token holding the '>' of the nth `</Step>` in `text`."""
    ends = [i + len("</Step>") - 1 for i in range(len(text)) if text.startswith("</Step>", i)]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        if s <= ends[nth] < e:
            return t
    raise AssertionError("no token covers the tag")


def test_step_rewards_land_on_step_end_tokens(models, tmp_path):
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.2]), reward="step",
                                       reward_shaping="centered", missing_eos_penalty=1.0, no_answer_penalty=0.5)
    text = join_steps(["Ava has 3 + 4 = 7 apples.", "She has 7 - 2 = 5. The answer is <ans>5</ans>."])
    batch, ids = rollouts_from_texts(trainer, tok, train[:1], [text])
    rewards, stats = trainer.rewards(batch)
    row = rewards[0]
    first, second = close_tag_token(tok, text, 0), close_tag_token(tok, text, 1)
    assert row[first].item() == pytest.approx(0.4)
    assert row[second].item() == pytest.approx(-0.3)
    others = [t for t in range(len(ids[0])) if t not in (first, second)]
    assert all(row[t].item() == 0 for t in others)  # EOS present and an answer: no penalties
    assert stats["rollout/steps_per_response"] == 2


THREE_STEPS = ["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5.", "The answer is <ans>5</ans>."]


def rewards_of_three_step_path(models, tmp_path, **overrides):
    """Rewards of one answered path of three steps scored 0.9, 0.2, 0.6, and its last token."""
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.2, 0.6]), **overrides)
    batch, ids = rollouts_from_texts(trainer, tok, train[:1], [join_steps(THREE_STEPS)])
    rewards, stats = trainer.rewards(batch)
    return rewards[0], stats, len(ids[0]) - 1


def test_steps_not_found_in_tokens_pay_the_same_total_at_the_end(models, tmp_path, monkeypatch):
    # when a path's step ends cannot be matched to its scores, step mode pays what it would have
    # paid in all (min-form: the weakest step's score) on the last token, and counts the path
    import rl.reward_table as reward_table

    monkeypatch.setattr(reward_table, "step_end_char_positions", lambda text: [])
    for shaping, total in (("min", 0.2), ("raw", 0.9 + 0.2 + 0.6), ("delta", 0.6 - 0.5)):
        row, stats, last = rewards_of_three_step_path(models, tmp_path, reward="step", reward_shaping=shaping)
        assert row[last].item() == pytest.approx(total), shaping
        assert row[:last].abs().sum().item() == 0
        assert stats["rollout/unlocated_steps_frac"] == 1


def test_outcome_gold_and_penalties_go_to_the_last_token(models, tmp_path):
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.2]), reward="outcome",
                                       reward_shaping="raw", outcome_aggregation="last",
                                       missing_eos_penalty=1.0, no_answer_penalty=0.5)
    text = join_steps(["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5."])  # no <ans>: the no-answer penalty
    batch, ids = rollouts_from_texts(trainer, tok, train[:1], [text], eos=False)  # truncated: missing EOS
    rewards, stats = trainer.rewards(batch)
    last = len(ids[0]) - 1
    assert rewards[0, last].item() == pytest.approx(0.2 - 1.0 - 0.5)
    assert rewards[0, :last].abs().sum().item() == 0
    assert stats["rollout/truncated_frac"] == 1 and stats["rollout/no_answer_frac"] == 1

    # the whole-path score can be another aggregate of the step scores: min(0.9, 0.2, 0.6) with
    # min shaping is the same total reward step mode gives, all of it on the last token
    for how, whole in (("min", 0.2), ("last", 0.6), ("mean", (0.9 + 0.2 + 0.6) / 3)):
        row, _, last = rewards_of_three_step_path(models, tmp_path, reward="outcome", reward_shaping="min",
                                                  outcome_aggregation=how)
        assert row[last].item() == pytest.approx(whole), how
        assert row[:last].abs().sum().item() == 0
    with pytest.raises(ValueError, match="outcome_aggregation"):
        make_trainer(models, tmp_path, FixedVerifier([0.5]), reward="outcome", outcome_aggregation="max")

    gold_trainer, tok, train = make_trainer(models, tmp_path, None, reward="gold")
    problem = train[0]
    right = join_steps([f"The answer is <ans>{problem.answer}</ans>."])
    wrong = join_steps([f"The answer is <ans>{int(problem.answer) + 1}</ans>."])
    batch, ids = rollouts_from_texts(gold_trainer, tok, [problem, problem], [right, wrong])
    rewards, stats = gold_trainer.rewards(batch)
    assert rewards[0].sum().item() == pytest.approx(1.0) and rewards[0, len(ids[0]) - 1].item() == pytest.approx(1.0)
    assert rewards[1].abs().sum().item() == 0
    assert stats["rollout/accuracy"] == 0.5


def test_the_logged_rollout_accuracy_counts_by_the_runs_answer_check(models, tmp_path):
    """rollout/accuracy is the same check as the gold reward: under --answer_match flexible a bare
    last number counts, under strict it does not (the tokenizer may not spell every word; the
    texts only need a right last number and no stated answer)."""
    accuracy = {}
    for match in ("strict", "flexible"):
        trainer, tok, train = make_trainer(models, tmp_path / match, None, reward="gold", answer_match=match,
                                           no_answer_penalty=0.5)
        problem = train[0]
        bare = join_steps([f"{problem.answer}"])
        stated = join_steps([f"The answer is <ans>{problem.answer}</ans>."])
        batch, _ = rollouts_from_texts(trainer, tok, [problem, problem], [stated, bare])
        rewards, stats = trainer.rewards(batch)
        accuracy[match] = (stats["rollout/accuracy"], [round(r.sum().item(), 6) for r in rewards])
    # the bare number: 0 or 1 from the answer check, less the format penalty for stating no answer
    assert accuracy == {"strict": (0.5, [1.0, -0.5]), "flexible": (1.0, [1.0, 0.5])}


def test_a_users_reward_functions_join_the_built_in_ones_where_they_land(models, tmp_path):
    # a TRL-shaped per-sequence function (its weight times its value at the last token) beside the
    # gold reward, and a per-step one paying at the step ends it names (None: nothing, not credited)
    seen = {}

    def brevity(prompts, completions, completion_ids, answer, **kwargs):
        seen.update(kwargs, answer=answer, prompts=prompts)
        return [-float(len(ids)) for ids in completion_ids]

    class FirstStepBonus:
        per_step = True

        def __call__(self, prompts, completions, steps, **_):
            return [[0.25] + [None] * (len(s) - 1) for s in steps]

    trainer, tok, train = make_trainer(models, tmp_path, None, reward_funcs=[brevity, FirstStepBonus()],
                                       reward_weights=[0.01, 2.0], reward="gold", missing_eos_penalty=0.0,
                                       no_answer_penalty=0.0)
    problem = train[0]
    text = join_steps(["Ava has 3 + 4 = 7 apples.", f"The answer is <ans>{problem.answer}</ans>."])
    batch, ids = rollouts_from_texts(trainer, tok, [problem], [text])
    rewards, stats = trainer.rewards(batch)
    last, first = len(ids[0]) - 1, close_tag_token(tok, text, 0)
    assert rewards[0, last].item() == pytest.approx(1.0 - 0.01 * len(ids[0]))
    assert rewards[0, first].item() == pytest.approx(0.5)
    assert rewards[0].abs().sum().item() == pytest.approx(abs(1.0 - 0.01 * len(ids[0])) + 0.5)
    assert batch.reward_mask[0].nonzero().flatten().tolist() == [first, last]
    assert stats["reward/gold_mean"] == pytest.approx(1.0)
    assert stats["reward/brevity_mean"] == pytest.approx(-0.01 * len(ids[0]))
    assert stats["reward/FirstStepBonus_mean"] == pytest.approx(0.5)
    assert seen["answer"] == [problem.answer] and seen["question"] == [problem.question]
    assert seen["steps"] == [["Ava has 3 + 4 = 7 apples.", f"The answer is <ans>{problem.answer}</ans>."]]
    assert seen["prompts"] == [solve_prompt(problem.question)]


def test_reward_functions_that_break_the_shape_are_named(models, tmp_path):
    def as_list(prompts, completions, **_):
        return [[1.0] for _ in completions]

    class WrongLength:
        per_step = True
        __name__ = "wrong_length"

        def __call__(self, prompts, completions, steps, **_):
            return [[1.0] * (len(s) + 1) for s in steps]

    def too_few(prompts, completions, **_):
        return []

    for func, message in ((as_list, "'as_list' returned a list"), (WrongLength(), "'wrong_length' returned 3 step"),
                          (too_few, "'too_few' returned 0 rewards for 1")):
        trainer, tok, train = make_trainer(models, tmp_path, None, reward_funcs=[func], reward="gold")
        text = join_steps(["So 3 + 4 = 7.", "The answer is <ans>7</ans>."])
        batch, _ = rollouts_from_texts(trainer, tok, train[:1], [text])
        with pytest.raises(ValueError, match=message):
            trainer.rewards(batch)
    with pytest.raises(ValueError, match="1 reward functions but 2 reward weights"):
        make_trainer(models, tmp_path, None, reward_funcs=[too_few], reward_weights=[1.0, 2.0], reward="gold")


def test_reward_funcs_flag_loads_a_file_a_module_or_a_dotted_path(models, tmp_path):
    from rl.rewards import answer_check, load_reward_func

    (tmp_path / "my_rewards.py").write_text(
        "def short(prompts, completions, **kwargs):\n    return [-len(c) / 100 for c in completions]\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    short = load_reward_func(f"{tmp_path / 'my_rewards.py'}:short")
    assert short(prompts=["q"], completions=["abcd"]) == [-0.04]
    assert load_reward_func("rl.rewards:answer_check") is answer_check
    assert load_reward_func("rl.rewards.answer_check") is answer_check
    for spec, message in ((f"{tmp_path / 'none.py'}:short", "no such file"),
                          (f"{tmp_path / 'my_rewards.py'}:long", "has no 'long'"),
                          ("no_such_module_here:f", "cannot import no_such_module_here"), ("short", "expected"),
                          (f"{tmp_path / 'broken.py'}:f", "broken.py failed to load: SyntaxError")):
        with pytest.raises(ValueError, match=message):
            load_reward_func(spec)
    # on the command line, the weights pair with the functions; the flags reach the trainer
    from rl.ppo_cli import parse_config

    args = parse_config(tiny_args(models, tmp_path / "o", "--reward", "gold", "--reward_funcs",
                                  f"{tmp_path / 'my_rewards.py'}:short", "--reward_weights", "3"))
    assert args.reward_funcs == [f"{tmp_path / 'my_rewards.py'}:short"] and args.reward_weights == [3.0]
    with pytest.raises(ValueError, match="2 weights for 1 --reward_funcs"):
        StepPPOConfig(output_dir=str(tmp_path), reward="gold", reward_funcs=["rl.rewards:answer_check"],
                      reward_weights=[1.0, 2.0], report_to="none").validate()
    with pytest.raises(ValueError, match="cannot add --reward_funcs"):
        StepPPOConfig(output_dir=str(tmp_path), reward="gold", advantage_estimator="mc_values",
                      reward_funcs=["rl.rewards:answer_check"], report_to="none").validate()


def test_the_gold_reward_is_a_trl_reward_function():
    # what TRL's GRPOTrainer passes: prompts, completions, completion_ids and the dataset's columns
    from rl.rewards import answer_check

    got = answer_check(prompts=["p", "p"], completions=["The answer is <ans>12</ans>.", "So it is 12."],
                       completion_ids=[[1], [2]], answer=["12", "12"], trainer_state=None)
    assert got == [1.0, 0.0] and answer_check.__name__ == "gold"


def test_update_changes_the_policy_and_skips_nan_batches(models, tmp_path):
    trainer, tok, _ = make_trainer(models, tmp_path, FixedVerifier([0.7, 0.4]))
    before = [p.detach().clone() for p in trainer._unwrapped_policy().parameters()]
    metrics = trainer.step(0)
    after = list(trainer._unwrapped_policy().parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    for key in ("loss/policy", "loss/value", "objective/kl", "policy/entropy", "rollout/steps_per_response",
                "rollout/tokens_per_step", "reward/mean_total"):
        assert key in metrics and metrics[key] == metrics[key], key

    warm, _, _ = make_trainer(models, tmp_path, FixedVerifier([0.7, 0.4]), critic_warmup_updates=1)
    policy0 = [p.detach().clone() for p in warm._unwrapped_policy().parameters()]
    critic0 = [p.detach().clone() for p in warm.accelerator.unwrap_model(warm.model).critic.parameters()]
    warm.step(0)  # a warm-up update trains the critic only
    assert all(torch.equal(a, b) for a, b in zip(policy0, warm._unwrapped_policy().parameters()))
    critic = warm.accelerator.unwrap_model(warm.model).critic.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(critic0, critic))

    nan_trainer, _, _ = make_trainer(models, tmp_path, FixedVerifier([float("nan")]))
    frozen = [p.detach().clone() for p in nan_trainer._unwrapped_policy().parameters()]
    metrics = nan_trainer.step(0)
    assert metrics["skipped"] == 1 and nan_trainer.skipped_batches == 1
    assert all(torch.equal(a, b) for a, b in zip(frozen, nan_trainer._unwrapped_policy().parameters()))


def test_lora_reference_is_the_base_with_adapters_disabled(models, tmp_path):
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.6]), use_peft=True, lora_r=4,
                                       learning_rate=5e-2)
    assert trainer.ref_policy is None
    text = join_steps(["The answer is <ans>3</ans>."])
    batch, _ = rollouts_from_texts(trainer, tok, train[:1], [text])
    rows = torch.arange(1)
    ref0 = trainer._ref_logprobs(batch, rows)
    for update in range(2):
        trainer.step(update)
    _, now, _ = trainer._forward(trainer.model, batch, rows, with_values=False)
    ref1 = trainer._ref_logprobs(batch, rows)
    assert torch.allclose(ref0, ref1, atol=1e-6)  # the reference did not move
    assert not torch.allclose(now.detach(), ref1, atol=1e-4)  # the adapters did


@pytest.mark.parametrize("reward", ["step", "outcome", "gold", "step+gold", "step own"])
def test_ppo_step_writes_metrics_eval_and_checkpoints(models, tmp_path, reward):
    out = tmp_path / reward.replace("+", "_").replace(" ", "_")
    extra = ["--reward", reward.split()[0]]
    if reward == "gold":
        extra += ["--advantage_estimator", "rloo"]
    if reward == "step own":  # the group estimator, each step credited with its own reward
        extra += ["--advantage_estimator", "group", "--step_credit", "own"]
    assert ppo_step.main(tiny_args(models, out, *extra)) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [0, 1, 2]  # update 0: the probe before training
    for line in lines:  # the learning curve: the probe at the start and every update (probe_every 1)
        assert 0 <= line["probe/greedy_accuracy"] <= 1
    assert all(0 <= m["rollout/same_reward_groups"] <= 1 for m in lines[1:])
    # the training clock starts after the evaluation before training, at the first probe's row
    assert lines[0]["elapsed"] == 0.0 and 0 < lines[1]["elapsed"] <= lines[2]["elapsed"]
    result = json.loads((out / "eval.json").read_text())
    for key in ("greedy_accuracy_before", "greedy_accuracy_after", "n", "improvement_ci_low", "improvement_ci_high"):
        assert key in result
    assert result["n"] == 6 and result["updates"] == 2
    assert (out / "policy" / "config.json").exists() and (out / "checkpoint-2" / "trainer_state.json").exists()


def test_checkpoint_curve_evaluates_every_checkpoint(models, tmp_path, capsys):
    from safetensors.torch import load_file

    from rl.tools import checkpoint_curve

    out = tmp_path / "curve"
    assert ppo_step.main(tiny_args(models, out, "--critic_warmup_updates", "0")) == 0
    # the policy inside the last checkpoint is the exported final policy; the first one differs
    final = load_file(str(out / "policy" / "model.safetensors"))
    last = checkpoint_curve.policy_state_from_checkpoint(out / "checkpoint-2")
    first = checkpoint_curve.policy_state_from_checkpoint(out / "checkpoint-1")
    assert set(final) <= set(last) and all(torch.equal(final[k], last[k]) for k in final)
    assert any(not torch.equal(first[k], last[k]) for k in final)

    (out / "checkpoint-9").mkdir()  # a checkpoint without model weights is reported, not fatal
    (out / "checkpoint-9" / "trainer_state.json").write_text("{}")
    capsys.readouterr()
    assert checkpoint_curve.main(tiny_args(models, out)) == 0
    table = capsys.readouterr().out
    curve = json.loads((out / "checkpoint_curve.json").read_text())
    assert [c["update"] for c in curve["curve"]] == [1, 2] and curve["n"] == 6
    # each checkpoint's rows are kept for `rl_comparison RUN@N`; the last is the final evaluation
    from rl.run_dir import RunDir
    assert RunDir(out).correct_at(2) == RunDir(out).correct("after") and len(RunDir(out).correct_at(1)) == 6
    assert [s["update"] for s in curve["skipped"]] == [9] and "model.safetensors" in curve["skipped"][0]["reason"]
    result = json.loads((out / "eval.json").read_text())
    assert curve["curve"][-1]["greedy_accuracy"] == pytest.approx(result["greedy_accuracy_after"])
    assert curve["greedy_accuracy_before"] == pytest.approx(result["greedy_accuracy_before"])
    assert "| 2 |" in table

    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint_curve.main(tiny_args(models, empty)) == 2

    # a LoRA run's checkpoints hold adapter weights: the curve rebuilds the same adapted policy
    lora = tmp_path / "lora"
    lora_args = ["--critic_warmup_updates", "0", "--use_peft", "true", "--lora_r", "4"]
    assert ppo_step.main(tiny_args(models, lora, *lora_args)) == 0
    assert checkpoint_curve.main(tiny_args(models, lora, *lora_args)) == 0
    curve = json.loads((lora / "checkpoint_curve.json").read_text())
    assert [c["update"] for c in curve["curve"]] == [1, 2] and not curve["skipped"]
    assert curve["curve"][-1]["greedy_accuracy"] == pytest.approx(
        json.loads((lora / "eval.json").read_text())["greedy_accuracy_after"])


def test_bad_config_values_are_clear_errors(models, tmp_path, capsys):
    assert ppo_step.main(tiny_args(models, tmp_path / "x", "--reward", "sparkle")) == 2
    assert "--reward must be one of" in capsys.readouterr().err
    assert ppo_step.main(tiny_args(models, tmp_path / "y", "--advantage_estimator", "rloo",
                                   "--samples_per_prompt", "1")) == 2
    capsys.readouterr()
    assert ppo_step.main(tiny_args(models, tmp_path / "z", "--step_credit", "future")) == 2
    assert "--step_credit must be one of return, own" in capsys.readouterr().err


def test_a_step_reward_defaults_to_own_step_delta_credit_and_deepseekmath_s_form_stays_by_name(tmp_path):
    """`--reward step` / `step+gold` with no credit flag get the form the three-seed study ranks best
    and ungamed (docs/results/when_step_rewards_pay.md), recorded resolved in run_config.json: own-step
    delta for a verifier whose score is a value, raw with return credit for one that judges each step
    on its own (the default verifier LM's step likelihood); the long-world recipe
    does not pin another; a form given by name is kept."""
    from rl.ppo_cli import parse_config
    from rl.run_dir import RUN_CONFIG, prepare_run_dir

    base = ["--output_dir", str(tmp_path / "run"), "--build_missing", "false", "--report_to", "none"]

    def form(*flags):
        config = parse_config([*base, *flags])
        return config.reward_shaping, config.step_credit

    value = ("--verifier", "exact")  # the step checker: a value (1 while every step so far is right)
    assert form("--reward", "step", *value) == form("--reward", "step+gold", *value) == ("delta", "own")
    long_recipe = ("--config", str(ROOT / "configs" / "ppo" / "long_world.yaml"))
    assert form(*long_recipe, "--reward", "step", *value) == ("delta", "own")
    # the default verifier (step-likelihood) and step-confidence judge each step on its own
    assert form("--reward", "step") == form(*long_recipe, "--reward", "step") == ("raw", "return")
    assert form("--reward", "step+gold") == form(*long_recipe, "--reward", "step+gold") == ("raw", "return")
    assert form("--reward", "step", "--verifier", "step-confidence:outputs/sft_tiny") == ("raw", "return")
    assert form("--reward", "step", "--verifier", "product:exact,step-likelihood:outputs/x") == ("delta", "own")
    assert form("--reward", "step", "--reward_shaping", "delta") == ("delta", "return")  # a value given is kept
    assert form("--reward", "step", *value, "--reward_shaping", "raw", "--step_credit", "return") == ("raw", "return")
    assert form("--reward", "step", *value, "--reward_shaping", "min") == ("min", "own")
    assert form() == form("--reward", "outcome") == ("raw", "return")  # one reward per response: as before
    prepare_run_dir(parse_config([*base, "--reward", "step", *value]))
    stored = json.loads((tmp_path / "run" / RUN_CONFIG).read_text())
    assert (stored["reward_shaping"], stored["step_credit"]) == ("delta", "own")
    prepare_run_dir(parse_config([*base, "--reward", "step", "--overwrite_output_dir", "true"]))
    stored = json.loads((tmp_path / "run" / RUN_CONFIG).read_text())
    assert (stored["reward_shaping"], stored["step_credit"]) == ("raw", "return")


def test_a_run_stored_before_a_setting_existed_resumes_with_the_value_it_computed_with():
    from rl.run_dir import settings_changes

    old_run = {"learning_rate": 1e-3}  # written before --step_credit existed: its runs summed returns
    assert settings_changes(old_run, {"learning_rate": 1e-3, "step_credit": "return"}) == []
    assert settings_changes(old_run, {"learning_rate": 1e-3, "step_credit": "own"}) == [
        "step_credit: 'return' -> 'own'"]
    # written before --entropy_coef existed: no entropy bonus
    assert settings_changes(old_run, {"learning_rate": 1e-3, "entropy_coef": 0.0}) == []
    assert settings_changes(old_run, {"learning_rate": 1e-3, "entropy_coef": 0.01}) == ["entropy_coef: 0.0 -> 0.01"]


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("ACCELERATE_USE_CPU", None)
    return env


def test_resume_after_sigkill_reaches_the_same_total(models, tmp_path):
    out = tmp_path / "killed"
    args = tiny_args(models, out)
    args[args.index("--num_updates") + 1] = "6"
    cmd = [sys.executable, str(ROOT / "rl" / "ppo_step.py"), *args, "--n_eval", "2"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("checkpoint-2")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(out.glob("checkpoint-*")), "no checkpoint before the kill"
    done = subprocess.run([*cmd, "--resume_from_checkpoint", "auto"], env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    updates = [json.loads(x)["update"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert updates == list(range(0, 7)), updates
    assert json.loads((out / "eval.json").read_text())["updates"] == 6


def test_a_resumed_run_names_its_checkpoint_and_counts_every_segments_seconds(models, tmp_path, capsys,
                                                                             monkeypatch):
    from rl.ppo_trainer import StepPPOTrainer

    step = StepPPOTrainer.step

    def slow_step(self, update):  # every update lasts over 0.05 s, whatever the machine's speed
        time.sleep(0.06)
        return step(self, update)

    monkeypatch.setattr(StepPPOTrainer, "step", slow_step)
    out = tmp_path / "segments"
    args = tiny_args(models, out, "--n_eval", "2", "--n_probe", "0")
    assert ppo_step.main(args) == 0
    first = json.loads((out / "eval.json").read_text())["train_seconds"]
    stored = json.loads((out / "checkpoint-2" / "step_ppo_state.json").read_text())["train_seconds"]
    assert first > 0 and stored > 0
    # killed after its last checkpoint: the resumed run trains no update, yet its seconds are the run's
    (out / "eval.json").unlink()
    capsys.readouterr()
    assert ppo_step.main([*args, "--resume_from_checkpoint", "auto"]) == 0
    assert f"resuming from {out / 'checkpoint-2'} (update 2 of 2" in capsys.readouterr().err
    assert json.loads((out / "eval.json").read_text())["train_seconds"] >= stored
    # resumed to train longer: the seconds of both segments
    assert ppo_step.main([*args, "--resume_from_checkpoint", "auto", "--num_updates", "3"]) == 0
    resumed = json.loads((out / "eval.json").read_text())
    assert resumed["updates"] == 3 and resumed["train_seconds"] >= stored + 0.05
    elapsed = [json.loads(x)["elapsed"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert elapsed == sorted(elapsed)  # cumulative across the segments


def test_a_time_limit_stops_after_the_update_that_reaches_it_and_the_run_resumes_past_it(models, tmp_path, capsys):
    out = tmp_path / "timed"
    args = tiny_args(models, out, "--n_eval", "2", "--n_probe", "2", "--num_updates", "4", "--save_steps", "0")
    # any update lasts longer than a millisecond: the limit lets the first run, and no second
    assert ppo_step.main([*args, "--max_train_seconds", "0.001"]) == 0
    assert "stopping after update 1 of 4" in capsys.readouterr().err
    result = json.loads((out / "eval.json").read_text())
    assert result["updates"] == 1 and result["stopped_early"] == "max_train_seconds"
    assert "greedy_accuracy_after" in result  # evaluated after, as at --max_steps
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [0, 1] and "probe/greedy_accuracy" in rows[-1]  # logged, probed
    assert (out / "checkpoint-1").is_dir()
    # resumed without the limit: the remaining updates, and eval.json no longer says it stopped
    assert ppo_step.main([*args, "--resume_from_checkpoint", "auto"]) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["updates"] == 4 and result["stopped_early"] is None
    assert [json.loads(x)["update"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_a_token_budget_stops_before_the_update_that_would_pass_it_and_resumes_counting(models, tmp_path, capsys):
    """--max_generated_tokens: rollout/tokens_cumulative sums every update's sampled tokens; the run
    ends after the update whose successor, taken to sample as many tokens, would pass the budget,
    with its checkpoint; a resumed run goes on counting from the checkpoint's total."""
    def run(name, *extra):
        out = tmp_path / name
        args = tiny_args(models, out, "--n_eval", "2", "--n_probe", "0", "--num_updates", "4", "--save_steps", "0",
                         "--logging_steps", "1", *extra)
        assert ppo_step.main(args) == 0
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return args, out, [r for r in rows if "rollout/tokens" in r]

    _, whole, rows = run("whole")
    tokens = [r["rollout/tokens"] for r in rows]
    cumulative = [r["rollout/tokens_cumulative"] for r in rows]
    assert len(rows) == 4 and all(t > 0 for t in tokens)
    assert cumulative == pytest.approx([sum(tokens[: k + 1]) for k in range(4)])
    assert json.loads((whole / "eval.json").read_text())["generated_tokens"] == pytest.approx(cumulative[-1])
    budget = int(cumulative[1]) + 1  # two updates fit; a third, the size of the second, would not
    expected = next(u for u in range(1, 4) if cumulative[u - 1] + tokens[u - 1] > budget)
    capsys.readouterr()
    args, out, cut = run("budget", "--max_generated_tokens", str(budget))
    assert f"stopping after update {expected} of 4" in capsys.readouterr().err
    result = json.loads((out / "eval.json").read_text())
    assert result["stopped_early"] == "max_generated_tokens" and result["updates"] == expected
    spent = result["generated_tokens"]
    assert spent == pytest.approx(cumulative[expected - 1]) and spent <= budget
    assert (out / f"checkpoint-{expected}").is_dir() and "greedy_accuracy_after" in result
    assert ppo_step.main([*args[:-2], "--resume_from_checkpoint", "auto"]) == 0  # the budget dropped
    resumed = json.loads((out / "eval.json").read_text())
    assert resumed["updates"] == 4 and resumed["stopped_early"] is None
    assert resumed["generated_tokens"] == pytest.approx(cumulative[-1])  # the same rollouts, counted on
    with pytest.raises(ValueError, match="--max_generated_tokens must be > 0"):
        StepPPOConfig(max_generated_tokens=0)


def test_the_evaluation_after_training_is_not_counted_as_training(models, tmp_path, monkeypatch):
    from rl.ppo_eval import PolicyEvaluator

    evaluate = PolicyEvaluator.greedy_eval

    def slow_evaluation(self, *args, **kwargs):  # a second longer than the real one, before and after training
        time.sleep(1.0)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(PolicyEvaluator, "greedy_eval", slow_evaluation)
    out = tmp_path / "clock"
    assert ppo_step.main(tiny_args(models, out, "--n_eval", "2", "--n_probe", "0", "--save_steps", "0")) == 0
    result = json.loads((out / "eval.json").read_text())
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["update"] == 2
    # the clock stops with the last update: not the checkpoint, the save or the second in the evaluation after
    assert last["elapsed"] <= result["train_seconds"] < last["elapsed"] + 0.5


@pytest.mark.parametrize("seconds", ["0", "-5"])
def test_a_time_limit_that_allows_nothing_is_refused(seconds):
    with pytest.raises(ValueError, match="--max_train_seconds must be > 0"):
        StepPPOConfig(max_train_seconds=float(seconds))


def test_two_cpu_processes_keep_identical_policies(models, tmp_path):
    out = tmp_path / "ddp"
    env = dict(_env(), ACCELERATE_USE_CPU="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"), str(ROOT / "rl" / "ppo_step.py"),
           *tiny_args(models, out, "--n_eval", "2", "--lr_scheduler_type", "linear",
                      # a limit never reached: rank 0's clock is sent to both ranks after each update
                      "--max_train_seconds", "1e6")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    # on failure, show each rank's own lines too: the tail alone is the launcher's report of rank 0's SIGTERM
    rank_lines = "\n".join(line for line in done.stderr.splitlines() if "[rank1]" in line or "Error" in line)
    assert done.returncode == 0, rank_lines[-3000:] + "\n---\n" + done.stderr[-2000:]
    result = json.loads((out / "eval.json").read_text())
    assert result["processes"] == 2 and result["updates"] == 2 and result["stopped_early"] is None
    assert result["responses_per_update"] == 2 * 4 * 2
    # a linear schedule over the whole run: after update 1 of 2 half the learning rate is left
    lrs = {m["update"]: m["lr"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in m}
    assert lrs[1] == pytest.approx(0.5e-3)
    from safetensors.torch import load_file

    ckpt = out / "checkpoint-2"
    # accelerate saves one copy of the (synchronised) model; compare it against the exported policy,
    # and check the per-rank policy hashes the trainer recorded
    hashes = json.loads((out / "policy_hashes.json").read_text())
    assert len(hashes) == 2 and len(set(hashes.values())) == 1, hashes
    assert (ckpt / "trainer_state.json").exists()
    assert load_file(str(out / "policy" / "model.safetensors"))


def test_shipped_default_recipe_is_the_embedded_default():
    from trl import TrlParser

    parser = TrlParser((StepPPOConfig,))
    (from_yaml,) = parser.parse_args_and_config(args=["--config", str(ROOT / "configs" / "ppo" / "tiny_world.yaml")])
    (default,) = parser.parse_args_and_config(args=[])
    import yaml

    keys = yaml.safe_load((ROOT / "configs" / "ppo" / "tiny_world.yaml").read_text())
    for name in keys:
        assert getattr(from_yaml, name) == getattr(default, name), name
    recipes = sorted(p.name for p in (ROOT / "configs" / "ppo").glob("*.yaml"))
    assert "world_compare_verifier_lm.yaml" in recipes
    for recipe in recipes:  # every shipped recipe parses and validates
        # bf16 needs a GPU, which TrainingArguments checks: turned off to parse here
        recipe_path = str(ROOT / "configs" / "ppo" / recipe)
        (cfg,) = parser.parse_args_and_config(args=["--config", recipe_path, "--bf16", "false"])
        cfg.validate()


def test_a_policy_built_first_gives_the_prompts_its_world(models, tmp_path, monkeypatch):
    """The no-argument run checks its prompts before the default policy exists (so in the default
    world), then builds the policy: training, evaluation and probe prompts must then come from the
    built policy's world (world_config.json), not from the default world they were checked in."""
    import shutil

    from reasoning.world import WorldConfig
    from rl import build_defaults, ppo_trainer

    assert WORLD != WorldConfig()
    monkeypatch.setattr(build_defaults, "build_default_policy",
                        lambda path, seed=0: shutil.copytree(models / "policy", path))
    seen = {}

    class Capture:
        def __init__(self, args, policy, tok, critic, verifier, train, evaluation, probe_problems=None, **_):
            seen.update(train=train, eval=evaluation, probe=probe_problems)

        def train(self, resume_from_checkpoint=None):
            return {}

    monkeypatch.setattr(ppo_trainer, "StepPPOTrainer", Capture)
    monkeypatch.chdir(tmp_path)
    assert ppo_step.main(["--reward", "gold", "--output_dir", "out", "--n_prompts", "16", "--n_eval", "6",
                          "--n_probe", "4", "--num_threads", "1", "--disable_tqdm", "true"]) == 0
    assert [p.question for p in seen["eval"]] == [r["question"] for r in generate("test", 6, 0, WORLD)]
    assert [p.question for p in seen["probe"]] == [r["question"] for r in generate("dev", 4, 0, WORLD)]
    assert all(len(p.meta["steps"]) <= WORLD.max_steps + 1 for p in seen["train"])  # + the answer step


def test_default_verifier_lm_is_built_in_the_policys_world_only_when_a_verifier_reward_needs_it(
        models, tmp_path, monkeypatch, capsys):
    """The default verifier (the verifier LM's step likelihood) is trained first when absent and a
    verifier reward reads it, with rl.sft flags that reproduce the policy's world; a gold run, a
    present one, or another spec builds nothing; the checks before loading let the default pass."""
    from trl import TrlParser

    from rl import build_defaults, ppo_setup
    from rl.sft import WorldSFTArguments, WorldSFTConfig

    policy = models / "policy"
    flags = build_defaults.verifier_lm_world_flags(str(policy))
    parsed, _ = TrlParser((WorldSFTArguments, WorldSFTConfig)).parse_args_and_config(
        args=["--output_dir", str(tmp_path / "v"), *flags])
    assert parsed.world_config() == WORLD  # the world of the models fixture, not rl.sft's default

    built = []
    monkeypatch.setattr(build_defaults, "build_default_verifier_lm", lambda pol, path: built.append(("lm", pol, path)))
    monkeypatch.setattr(build_defaults, "build_default_verifier", lambda pol, path: built.append(("psv", pol, path)))
    monkeypatch.chdir(tmp_path)  # the default paths are relative: nothing there yet
    assert build_defaults.DEFAULT_VERIFIER == f"step-likelihood:{build_defaults.DEFAULT_VERIFIER_LM}"
    assert StepPPOConfig(output_dir="o").verifier == build_defaults.DEFAULT_VERIFIER

    def cfg(**kw):
        return StepPPOConfig(output_dir=str(tmp_path / "run"), model_name_or_path=str(policy), report_to="none", **kw)

    build_defaults.ensure_default_models(cfg(reward="gold"), is_main=True)
    build_defaults.ensure_default_models(cfg(reward="step"), is_main=False)  # only the main process builds
    build_defaults.ensure_default_models(cfg(reward="step", build_missing=False), is_main=True)
    build_defaults.ensure_default_models(cfg(reward="step", verifier="exact"), is_main=True)
    assert built == []
    ppo_setup.check_inputs(cfg(reward="step"))  # absent, but it is built first: no error
    ppo_setup.check_inputs(cfg(reward="outcome", verifier=build_defaults.TREE_PSV))
    with pytest.raises(ppo_setup.ConfigError, match="psv_tiny"):  # not built without --build_missing
        ppo_setup.check_inputs(cfg(reward="outcome", verifier=build_defaults.TREE_PSV, build_missing=False))
    build_defaults.ensure_default_models(cfg(reward="step"), is_main=True)
    build_defaults.ensure_default_models(cfg(reward="outcome", verifier=build_defaults.TREE_PSV), is_main=True)
    assert built == [("lm", str(policy), build_defaults.DEFAULT_VERIFIER_LM),
                     ("psv", str(policy), build_defaults.TREE_PSV)]
    (tmp_path / build_defaults.DEFAULT_VERIFIER_LM).mkdir(parents=True)
    build_defaults.ensure_default_models(cfg(reward="step"), is_main=True)
    assert len(built) == 2  # present: not rebuilt, but a verifier LM of another world is named
    assert "another world" in capsys.readouterr().err
    (tmp_path / build_defaults.DEFAULT_VERIFIER_LM / "world_config.json").write_text(json.dumps(WORLD.__dict__))
    build_defaults.ensure_default_models(cfg(reward="step"), is_main=True)
    assert len(built) == 2 and "another world" not in capsys.readouterr().err


def test_critic_starts_from_the_psv_part_of_a_combined_verifier(models, tmp_path):
    from reward_models.load import load_verifier
    from reward_models.psv import load_psv_model
    from rl.ppo_setup import load_critic, load_policy

    spec = f"product:step-confidence:{models / 'policy'},{models / 'psv'}"
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), model_name_or_path=str(models / "policy"), verifier=spec,
                         build_missing=False, report_to="none", advantage_estimator="gae")
    _, tok = load_policy(args)
    critic = load_critic(args, tok)
    psv, _ = load_psv_model(str(models / "psv"))
    for (name, a), (_, b) in zip(critic.state_dict().items(), psv.state_dict().items()):
        assert torch.equal(a, b), name
    verifier = load_verifier(spec, args.model_name_or_path)
    assert [type(p).__name__ for p in verifier.parts] == ["ConfidenceVerifier", "PSVVerifier"]


def test_dropout_is_off_in_every_forward_ppo_compares(models, tmp_path):
    """Old values are computed in eval mode and new ones in train mode: with the critic's default
    classifier dropout (0.1) they would differ at identical weights."""
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.5]))
    critic = trainer.accelerator.unwrap_model(trainer.model).critic
    assert getattr(critic.config, "classifier_dropout", None) is None  # so the head gets the default 0.1
    batch, _ = rollouts_from_texts(trainer, tok, train[:2], [join_steps(["The answer is <ans>3</ans>."])] * 2)
    rows = torch.arange(2)
    with torch.no_grad():
        trainer.model.eval()
        _, lp_eval, v_eval = trainer._forward(trainer.model, batch, rows, with_values=True)
        trainer.model.train()
        _, lp_train, v_train = trainer._forward(trainer.model, batch, rows, with_values=True)
    assert torch.equal(v_eval, v_train) and torch.equal(lp_eval, lp_train)


def test_seed_decides_every_initial_weight(models, tmp_path):
    """LoRA matrices and a new value head are made after seeding: one --seed, one run."""
    from safetensors.torch import load_file

    weights = []
    for name, noise in (("a", 1), ("b", 2)):
        torch.manual_seed(noise)  # whatever came before must not matter
        out = tmp_path / name
        assert ppo_step.main(tiny_args(models, out, "--use_peft", "true", "--lora_r", "4", "--critic_init", "policy",
                                       "--num_updates", "1", "--n_eval", "0", "--eval_dataset", "none",
                                       "--n_probe", "0")) == 0
        weights.append((load_file(str(out / "policy" / "adapter_model.safetensors")),
                        load_file(str(out / "critic" / "adapter_model.safetensors"))))
    for first, second in zip(*weights):
        assert first.keys() == second.keys()
        for key in first:
            assert torch.equal(first[key], second[key]), key


def test_schedule_counts_every_process():
    from rl.ppo_prepare import scheduler_steps

    args = StepPPOConfig(output_dir="x", max_steps=10, num_iterations=2, num_mini_batches=4, report_to="none")
    assert scheduler_steps(args, 1) == 80
    assert scheduler_steps(args, 2) == 160  # accelerate steps a prepared scheduler once per process


def test_group_estimator_updates_without_a_critic(models, tmp_path):
    """A critic-free estimator keeps no critic (no memory, no forwards, nothing saved), even when one
    is passed in, and the policy moves on the first update (no critic warm-up)."""
    trainer, tok, _ = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.1]), advantage_estimator="group",
                                   reward="step", reward_shaping="raw", critic_warmup_updates=5)
    assert trainer.accelerator.unwrap_model(trainer.model).critic is None
    assert len(trainer.optimizer.param_groups) == 1
    before = [p.detach().clone() for p in trainer._unwrapped_policy().parameters()]
    metrics = trainer.step(0)  # no warm-up without a critic: the policy moves at once
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer._unwrapped_policy().parameters()))
    assert "loss/value" not in metrics and 0 <= metrics["rollout/flat_reward_groups"] <= 1
    trainer.args.max_steps = 1
    trainer.update = 1
    trainer.train()
    assert (trainer.out / "policy").is_dir() and not (trainer.out / "critic").exists()
    # the trained policy keeps its world, so `--dataset world --policy OUT/policy` reads the same problems
    saved = json.loads((trainer.out / "policy" / "world_config.json").read_text())
    assert saved == json.loads((models / "policy" / "world_config.json").read_text())


def test_config_errors_are_one_line_and_found_before_any_model_loads(models, tmp_path, capsys, monkeypatch):
    import rl.ppo_setup

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the configuration was checked")

    monkeypatch.setattr(rl.ppo_setup, "load_policy", no_loading)
    monkeypatch.setattr(rl.ppo_setup, "load_critic", no_loading)
    recipe = tmp_path / "recipe.yaml"
    cases = [
        ("rewrad: step\n", [], "Unknown arguments from config file: ['--rewrad', 'step']"),
        ("kl_coef: [1, 2]\n", [], "--kl_coef must be float, got [1, 2]"),
        ("", ["--no_such_flag", "1"], "--no_such_flag"),
        ("", ["--num_updates", "many"], "invalid int value: 'many'"),
        ("", ["--policy", str(tmp_path / "nonexistent")], "no such model directory"),
        ("", ["--verifier", str(models / "psvv")], "verifier '" + str(models / "psvv") + "': no such directory"),
        ("", ["--verifier", "product:exact"], "needs two or more"),
        ("", ["--dataset", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file"),
    ]
    for yaml_text, flags, message in cases:
        recipe.write_text(yaml_text or "seed: 0\n")
        code = ppo_step.main(["--config", str(recipe), *tiny_args(models, tmp_path / "run", *flags)])
        err = capsys.readouterr().err
        assert code == 2 and message in err, (flags, err)
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
    missing = ppo_step.main(["--config", str(tmp_path / "none.yaml"), *tiny_args(models, tmp_path / "run")])
    assert missing == 2 and "none.yaml" in capsys.readouterr().err


def test_output_dir_holds_one_run(models, tmp_path, capsys):
    """A fresh run refuses a used folder; --overwrite_output_dir clears it; a resume must keep the
    run's settings (run_config.json); rl.tools.checkpoint_curve then needs only --output_dir."""
    from rl.run_dir import RUN_CONFIG
    from rl.tools import checkpoint_curve

    out = tmp_path / "run"
    assert ppo_step.main(tiny_args(models, out, "--critic_warmup_updates", "0")) == 0
    assert json.loads((out / RUN_CONFIG).read_text())["max_steps"] == 2
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()

    assert ppo_step.main(tiny_args(models, out, "--num_updates", "1")) == 2  # used to mix the two runs
    assert "is not empty" in capsys.readouterr().err and sorted(p.name for p in out.iterdir()) == before

    args = tiny_args(models, out, "--critic_warmup_updates", "0", "--num_updates", "1")
    assert ppo_step.main([*args, "--overwrite_output_dir", "true"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # the old run's are gone
    assert [json.loads(x)["update"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]

    capsys.readouterr()
    changed = [*args, "--resume_from_checkpoint", "auto", "--learning_rate", "5e-4"]
    assert ppo_step.main(changed) == 2
    err = capsys.readouterr().err
    assert "learning_rate: 0.001 -> 0.0005" in err and err.count("\n") == 1
    longer = tiny_args(models, out, "--critic_warmup_updates", "0", "--num_updates", "2")
    assert ppo_step.main([*longer, "--resume_from_checkpoint", "auto"]) == 0  # num_updates may change
    assert [json.loads(x)["update"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]

    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert ppo_step.main([*tiny_args(models, foreign), "--overwrite_output_dir", "true"]) == 2
    assert (foreign / "keep.txt").exists() and "not cleared" in capsys.readouterr().err

    assert checkpoint_curve.main(["--output_dir", str(out), "--num_threads", "1"]) == 0
    curve = json.loads((out / "checkpoint_curve.json").read_text())
    assert [c["update"] for c in curve["curve"]] == [1, 2] and curve["n"] == 6


def test_group_estimator_normalises_only_credited_rewards(models, tmp_path):
    """The reward mask marks the tokens a group estimator normalises: every step end (raw), the
    weakest step's end alone (min-form credit), and the last token for outcome rewards."""
    for shaping, marked in (("raw", 3), ("min", 1)):
        trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.2, 0.6]), reward="step",
                                           reward_shaping=shaping, advantage_estimator="group")
        text = join_steps(THREE_STEPS)
        batch, _ = rollouts_from_texts(trainer, tok, train[:1], [text])
        rewards, _ = trainer.rewards(batch)
        mask = batch.reward_mask[0]
        assert int(mask.sum().item()) == marked, shaping
        if shaping == "min":  # the mark sits on the weakest (second) step's closing tag
            assert mask[close_tag_token(tok, text, 1)] == 1 and rewards[0, close_tag_token(tok, text, 1)] == 0.2
    trainer, tok, train = make_trainer(models, tmp_path, FixedVerifier([0.9, 0.2, 0.6]), reward="outcome",
                                       reward_shaping="min", outcome_aggregation="min", advantage_estimator="group")
    batch, ids = rollouts_from_texts(trainer, tok, train[:1], [join_steps(THREE_STEPS)])
    rewards, _ = trainer.rewards(batch)
    assert batch.reward_mask[0].nonzero().flatten().tolist() == [len(ids[0]) - 1]
    assert rewards[0, len(ids[0]) - 1].item() == pytest.approx(0.2)


def test_entropy_bonus_raises_the_policys_entropy_where_rewards_give_no_gradient(models, tmp_path):
    """With the same reward for every sample (zero group advantages) and no KL term, an update moves
    the policy only through --entropy_coef: off, the weights stay bit-identical; on, they move and the
    policy's entropy on a fixed batch of responses rises."""
    import rl.ppo_math as M

    def entropy_on(trainer, batch):
        with torch.no_grad():
            logits, _, _ = trainer._forward(trainer.model, batch, torch.arange(len(batch.texts)), with_values=False)
            return M.masked_mean(M.entropy_from_logits(logits), batch.response_mask).item()

    texts = [join_steps(THREE_STEPS)] * 2
    for coef in (0.0, 1.0):
        trainer, tok, train = make_trainer(models, tmp_path / str(coef), FixedVerifier([0.5]),
                                           advantage_estimator="group",
                                           reward="outcome", outcome_aggregation="mean", beta=0.0, learning_rate=1e-2,
                                           no_answer_penalty=0.0, missing_eos_penalty=0.0,
                                           entropy_coef=coef)
        batch, _ = rollouts_from_texts(trainer, tok, train[:2], texts)
        before_w = [p.detach().clone() for p in trainer._unwrapped_policy().parameters()]
        before = entropy_on(trainer, batch)
        metrics = trainer.step(0)
        assert metrics["rollout/flat_reward_groups"] == 1.0
        moved = any(not torch.equal(a, b) for a, b in zip(before_w, trainer._unwrapped_policy().parameters()))
        if coef == 0.0:
            assert not moved and entropy_on(trainer, batch) == before
        else:
            # a bonus with the wrong sign would lower it (the untrained policy is near uniform, so the rise is small)
            assert moved and entropy_on(trainer, batch) > before, (before, entropy_on(trainer, batch))
    with pytest.raises(ValueError, match="entropy_coef"):
        StepPPOConfig(output_dir=str(tmp_path / "bad"), entropy_coef=-0.1).validate()


def test_drop_flat_groups_leaves_groups_without_signal_out_of_the_loss(models, tmp_path):
    """With the same reward for every sample every group is flat: with --drop_flat_groups nothing is
    left in the loss, so even an entropy bonus moves no weight; without it the bonus moves them. The
    flag needs the group estimator."""
    for drop in (True, False):
        trainer, _, _ = make_trainer(models, tmp_path / str(drop), FixedVerifier([0.5]), advantage_estimator="group",
                                     reward="outcome", outcome_aggregation="mean", beta=0.02, learning_rate=1e-2,
                                     no_answer_penalty=0.0, missing_eos_penalty=0.0, entropy_coef=1.0,
                                     drop_flat_groups=drop)
        before = [p.detach().clone() for p in trainer._unwrapped_policy().parameters()]
        metrics = trainer.step(0)
        assert metrics["rollout/flat_reward_groups"] == 1.0 and metrics["policy/entropy"] > 0
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer._unwrapped_policy().parameters()))
        assert moved is not drop
    with pytest.raises(ValueError, match="drop_flat_groups needs --advantage_estimator group"):
        StepPPOConfig(output_dir=str(tmp_path / "bad"), advantage_estimator="gae", drop_flat_groups=True).validate()


def test_scale_rewards_reaches_the_group_estimator_and_needs_it(models, tmp_path, monkeypatch):
    """--scale_rewards is what the update's group advantages are computed with; other estimators
    refuse a scale other than 'group', and an unknown one is refused by name."""
    import rl.ppo_math as M

    seen = []
    real = M.group_step_advantages

    def spy(*args, **kwargs):
        seen.append(kwargs.get("scale"))
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "group_step_advantages", spy)
    trainer, _, _ = make_trainer(models, tmp_path / "run", FixedVerifier([0.5]), advantage_estimator="group",
                                 reward="outcome", outcome_aggregation="mean", scale_rewards="batch")
    trainer.step(0)
    assert seen == ["batch"]
    with pytest.raises(ValueError, match="scale_rewards none needs --advantage_estimator group"):
        StepPPOConfig(output_dir=str(tmp_path / "bad"), advantage_estimator="rloo", scale_rewards="none").validate()
    with pytest.raises(ValueError, match="scale_rewards must be one of group, batch, none"):
        StepPPOConfig(output_dir=str(tmp_path / "bad"), scale_rewards="global").validate()
    # a run stored before the setting existed computed with 'group', and resumes only with it
    from rl.run_dir import settings_changes

    assert settings_changes({"seed": 0}, {"seed": 0, "scale_rewards": "group"}) == []
    assert settings_changes({"seed": 0}, {"seed": 0, "scale_rewards": "batch"}) == ["scale_rewards: 'group' -> 'batch'"]


def test_a_default_model_build_that_is_killed_leaves_no_model_and_is_started_again(tmp_path, monkeypatch, capsys):
    """A build stopped midway (a kill, Ctrl-C, a failure) left a half-written outputs/sft_tiny that the
    next run took for the policy and failed on with a traceback; it is written beside, renamed when done."""
    from rl import build_defaults, sft

    monkeypatch.chdir(tmp_path)

    def killed(argv):
        Path(argv[1]).mkdir(parents=True)
        (Path(argv[1]) / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(sft, "main", killed)
    with pytest.raises(KeyboardInterrupt):
        build_defaults.build_default_policy("outputs/sft_tiny", 0)
    assert not Path("outputs/sft_tiny").exists() and Path("outputs/sft_tiny.building").exists()

    def finished(argv):
        assert not Path(argv[1]).exists()  # the unfinished build is gone before the new one starts
        Path(argv[1]).mkdir(parents=True)
        (Path(argv[1]) / "model.safetensors").write_text("x")
        return 0

    monkeypatch.setattr(sft, "main", finished)
    build_defaults.build_default_policy("outputs/sft_tiny", 0)
    assert (Path("outputs/sft_tiny") / "model.safetensors").exists() and not Path("outputs/sft_tiny.building").exists()
    assert "unfinished build" in capsys.readouterr().err
    monkeypatch.setattr(sft, "main", lambda argv: 1)
    with pytest.raises(RuntimeError, match="exit code 1"):
        build_defaults.build_default_verifier_lm("outputs/sft_tiny", "outputs/lm")
    assert not Path("outputs/lm").exists()


def test_default_policy_is_built_with_the_sft_seed_and_a_policy_of_another_seed_is_refused(tmp_path, monkeypatch):
    """--sft_seed reaches the SFT run that builds the default policy; a default policy already there
    whose eval.json records another training seed stops the run before anything loads (one line),
    and one written before the seed was recorded counts as seed 0."""
    from rl import build_defaults, ppo_setup, sft

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(sft, "main", lambda argv: calls.append(argv) or Path(argv[1]).mkdir() or 0)
    build_defaults.build_default_policy("p", 2)
    assert calls == [["--output_dir", "p.building", "--seed", "2"]]
    assert Path("p").is_dir() and not Path("p.building").exists()

    def cfg(**kw):
        return StepPPOConfig(output_dir=str(tmp_path / "run"), report_to="none", reward="gold", **kw)

    assert StepPPOConfig(output_dir="o").reward == "gold" and StepPPOConfig(output_dir="o").sft_seed == 0
    built = []
    monkeypatch.setattr(build_defaults, "build_default_policy", lambda path, seed: built.append((path, seed)))
    build_defaults.ensure_default_models(cfg(sft_seed=1), is_main=True)
    assert built == [(build_defaults.DEFAULT_POLICY, 1)]

    policy = tmp_path / build_defaults.DEFAULT_POLICY
    policy.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (policy / name).write_text("{}")
    record = {"greedy_accuracy": 0.4, "world_config": {}}
    (policy / "eval.json").write_text(json.dumps(record))  # an older folder: no seed recorded
    assert ppo_setup.sft_seed_of(str(policy)) == 0
    with pytest.raises(ppo_setup.ConfigError, match=r"sft_tiny was trained with SFT seed 0, not --sft_seed 1"):
        ppo_setup.check_inputs(cfg(sft_seed=1))
    (policy / "eval.json").write_text(json.dumps({**record, "seed": 1}))
    ppo_setup.check_default_policy_seed(cfg(sft_seed=1))  # the asked-for draw: accepted
    with pytest.raises(ValueError, match="pass --sft_seed 1"):
        ppo_setup.check_default_policy_seed(cfg())
    ppo_setup.check_default_policy_seed(cfg(build_missing=False))  # a policy named by the user: not ours to judge


def test_answer_match_reaches_the_gold_reward(tmp_path, capsys):
    from rl.rewards import build_reward_funcs, call_reward_func

    completions = ["The answer is <ans>12</ans>.", "So it is 3 + 9 = 12", "No idea."]
    columns = {"answer": ["12"] * 3}
    paid = {}
    for match in ("strict", "flexible"):
        config = StepPPOConfig(output_dir=str(tmp_path), reward="gold", answer_match=match, report_to="none")
        (gold,) = [f for f in build_reward_funcs(config, None) if f.kind == "gold"]
        assert gold.name == "gold"
        paid[match] = call_reward_func(gold, ["p"] * 3, completions, [[1]] * 3, columns)
    assert paid == {"strict": [1.0, 0.0, 0.0], "flexible": [1.0, 1.0, 0.0]}
    assert StepPPOConfig(output_dir=str(tmp_path), report_to="none").answer_match == "strict"  # the default
    with pytest.raises(ValueError, match="--answer_match must be one of strict, flexible; got 'loose'"):
        StepPPOConfig(output_dir=str(tmp_path), answer_match="loose", report_to="none")
    capsys.readouterr()
    assert ppo_step.main(["--answer_match", "loose", "--output_dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "error: --answer_match must be one of strict, flexible; got 'loose'"
