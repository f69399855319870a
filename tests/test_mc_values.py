"""`--advantage_estimator mc_values` (VinePPO's Monte Carlo step values): the values of step
boundaries from continuations whose correctness the test decides, the settings it refuses, and a
short run of `rl/ppo_step.py` on a tiny policy taught the step format."""

import json
import math

import pytest
import torch

from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, generate
from rl import ppo_step
from rl.ppo_config import StepPPOConfig

WORLD = WorldConfig(min_steps=1, max_steps=2)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny policy given a few dozen steps of the world's solutions, enough that its samples are
    `<Step>` tagged (an untrained one writes untagged noise, one step per response)."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("mc_policy")
    rows = generate("train", 200, 0, WORLD)
    texts = [solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows]
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tok.padding_side = "right"
    order = torch.Generator().manual_seed(0)
    for _ in range(60):
        picked = torch.randint(len(texts), (16,), generator=order).tolist()
        enc = tok([texts[i] + tok.eos_token for i in picked], return_tensors="pt", padding=True,
                  add_special_tokens=False)
        loss = model(**enc, labels=enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(root)
    tok.save_pretrained(root)
    (root / "world_config.json").write_text(json.dumps(WORLD.__dict__))
    return root


def make_trainer(policy_dir, tmp_path, **overrides):
    from rl.ppo_setup import load_policy, load_problems
    from rl.ppo_trainer import StepPPOTrainer

    fields = dict(output_dir=str(tmp_path / "run"), model_name_or_path=str(policy_dir), build_missing=False,
                  n_prompts=8,
                  prompts_per_update=2, num_generations=2, max_completion_length=64, num_mini_batches=2,
                  report_to="none", disable_tqdm=True, reward="gold", advantage_estimator="mc_values",
                  mc_rollouts=4)
    fields.update(overrides)
    args = StepPPOConfig(**fields)
    train, _ = load_problems("world", args.n_prompts, args, "train")
    policy, tok = load_policy(args)
    return StepPPOTrainer(args, policy, tok, None, None, train, []), tok, train


def batch_of(tok, problems, texts):
    """A Rollouts batch whose responses are exactly `texts`, each closed by an EOS."""
    from rl.batches import Rollouts
    from rl.rollouts import response_tensors

    tok.padding_side = "left"
    enc = tok([solve_prompt(p.question) for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask, decoded = response_tensors(tok, [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                                                for t in texts])
    assert decoded == list(texts)
    return Rollouts(enc["input_ids"], enc["attention_mask"], ids, mask, decoded, list(problems))


def test_boundary_values_are_the_mean_reward_of_their_continuations(policy_dir, tmp_path):
    from rl import ppo_math as M

    trainer, tok, train = make_trainer(policy_dir, tmp_path)
    problem = train[0]
    answer = problem.answer
    right = join_steps([f"The answer is <ans>{answer}</ans>."])
    wrong = join_steps([f"The answer is <ans>{int(answer) + 1}</ans>."])
    three = join_steps(["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5.", f"The answer is <ans>{answer}</ans>."])
    batch = batch_of(tok, [problem, problem], [three, wrong])  # one prompt, two samples: rewards 1 and 0
    eos = tok.eos_token_id
    # what each boundary's continuations say, by the number of steps the prefix holds:
    #   after step 1: right, right, right, wrong             -> (1 + 1 + 1 + 0) / 4 = 0.75
    #   after step 2: right, unanswered and truncated, right, right
    #                 (0 - missing EOS 1.0 - no answer 0.5)   -> (1 - 1.5 + 1 + 1) / 4 = 0.375
    script = {1: [right, right, right, wrong], 2: [right, "<Step> So", right, right]}
    seen, prefixes_seen = [], []

    prompt_len = int(batch.query_mask[0].sum())

    def fake_continuations(prefixes, budgets, prover="policy", copies=1, owners=None, expected=None):
        out = []
        for prefix, budget in ((p, b) for p, b in zip(prefixes, budgets) for _ in range(copies)):
            head = prefix[prompt_len:]  # the response's tokens up to a step's end
            done = tok.decode(head, skip_special_tokens=True).count("</Step>")
            k = sum(1 for d, _, _ in seen if d == done)
            seen.append((done, budget, len(head)))
            prefixes_seen.append(list(prefix))
            piece = script[done][k]
            out.append(tok(piece, add_special_tokens=False)["input_ids"] + ([] if piece == "<Step> So" else [eos]))
        return out, {"continuations/tokens": float(sum(len(c) for c in out))}

    trainer.sampler.sample_continuations = fake_continuations
    rewards, _ = trainer.rewards(batch)
    got = trainer.sampler.mc_step_values(batch, rewards, trainer.rewards)
    values, steps, stats = got.values, got.token_steps, got.stats
    # V(s_0) of each sample: the other sample's reward; the last value: its own reward
    close_rows = [[0.0, 0.75, 0.375, 1.0], [1.0, 0.0]]
    for row, want in zip(values.tolist(), close_rows):
        assert row[: len(want)] == pytest.approx(want)
    assert sorted(d for d, _, _ in seen) == [1] * 4 + [2] * 4  # K = 4 from each boundary inside a response
    head_after = {d: h for d, _, h in seen}
    prompt_ids = batch.query_ids[0][batch.query_mask[0].bool()].tolist()
    assert all(p == prompt_ids + batch.response_ids[0, : len(p) - prompt_len].tolist() for p in prefixes_seen)
    # a prefix ends on the token that closes its step, and holds that many steps
    for d in (1, 2):
        text = tok.decode(batch.response_ids[0, : head_after[d]].tolist(), skip_special_tokens=True)
        assert text.endswith("</Step>") and text.count("</Step>") == d
    # a continuation may run as long as the response could: max_new_tokens from the response's start
    assert {(d, b) for d, b, _ in seen} == {(d, 64 - head_after[d]) for d in (1, 2)}
    assert stats["rollout/mc_prefixes"] == 2 and stats["mc/boundary_value_mean"] == pytest.approx((0.75 + 0.375) / 2)
    adv = M.step_value_advantages(values, steps, batch.response_mask)
    n_tokens = int(batch.response_mask[0].sum())
    first, second = head_after[1], head_after[2]
    # step 1: 0.75 - 0; step 2: 0.375 - 0.75; step 3 and the EOS: 1 - 0.375; the wrong sample: 0 - 1
    assert adv[0, :first].tolist() == pytest.approx([0.75] * first)
    assert adv[0, first:second].tolist() == pytest.approx([-0.375] * (second - first))
    assert adv[0, second:n_tokens].tolist() == pytest.approx([0.625] * (n_tokens - second))
    other = int(batch.response_mask[1].sum())
    assert adv[1, :other].tolist() == pytest.approx([-1.0] * other) and adv[1, other:].abs().sum() == 0


def test_segments_value_their_kept_boundaries_only(policy_dir, tmp_path):
    """--continuation_boundaries 1 on three steps: values after step 2 only; step 1 and 2 are one
    segment, every token of it credited with the change of value across the segment."""
    from rl import ppo_math as M

    trainer, tok, train = make_trainer(policy_dir, tmp_path, continuation_boundaries=1)
    problem = train[0]
    right = join_steps([f"The answer is <ans>{problem.answer}</ans>."])
    wrong = join_steps([f"The answer is <ans>{int(problem.answer) + 1}</ans>."])
    three = join_steps(["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5.", f"The answer is <ans>{problem.answer}</ans>."])
    batch = batch_of(tok, [problem, problem], [three, wrong])
    prompt_len = int(batch.query_mask[0].sum())
    held = []

    def fake_continuations(prefixes, budgets, prover="policy", copies=1, owners=None, expected=None):
        held.extend(tok.decode(p[prompt_len:], skip_special_tokens=True).count("</Step>") for p in prefixes)
        out = [tok(piece, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for _ in prefixes for piece in [right, wrong, wrong, wrong][:copies]]
        return out, {"continuations/tokens": float(sum(len(c) for c in out))}

    trainer.sampler.sample_continuations = fake_continuations
    rewards, _ = trainer.rewards(batch)
    got = trainer.sampler.mc_step_values(batch, rewards, trainer.rewards)
    assert held == [2] and got.stats["rollout/mc_prefixes"] == 1
    assert got.values[0].tolist()[:3] == pytest.approx([0.0, 0.25, 1.0])
    adv = M.step_value_advantages(got.values, got.token_steps, batch.response_mask)
    second = next(n for n in range(1, batch.response_ids.shape[1] + 1)
                  if tok.decode(batch.response_ids[0, :n].tolist(), skip_special_tokens=True).count("</Step>") == 2)
    n_tokens = int(batch.response_mask[0].sum())
    assert adv[0, :second].tolist() == pytest.approx([0.25] * second)  # steps 1 and 2: 0.25 - 0
    assert adv[0, second:n_tokens].tolist() == pytest.approx([0.75] * (n_tokens - second))  # step 3: 1 - 0.25


def test_continuations_come_from_the_prefix_within_their_budget(policy_dir, tmp_path):
    trainer, tok, train = make_trainer(policy_dir, tmp_path, generation_batch_size=2)
    prompt = tok(solve_prompt(train[0].question), add_special_tokens=False)["input_ids"]
    head = tok("<Step> Ava has 3 + 4 = 7 apples.</Step>", add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    out, _ = trainer.sampler.sample_continuations([prompt + head, prompt, prompt + head], [3, 40, 1])
    assert len(out[0]) <= 3 and len(out[2]) <= 1 and 1 <= len(out[1]) <= 40


@pytest.mark.parametrize("flags, message", [
    (["--reward", "step"], "needs --reward gold, got 'step'"),
    (["--samples_per_prompt", "1"], "mc_values needs --samples_per_prompt >= 2"),
    (["--mc_rollouts", "0"], "--mc_rollouts must be >= 1"),
    (["--reward_normalize", "true"], "--reward_normalize does not apply"),
    (["--rollout_backend", "vllm"], "--rollout_backend hf only"),
    (["--gamma", "0.9"], "undiscounted values (--gamma 1), got --gamma 0.9"),
])
def test_settings_mc_values_cannot_use_are_one_line_errors(tmp_path, capsys, flags, message):
    argv = ["--advantage_estimator", "mc_values", "--reward", "gold", "--output_dir", str(tmp_path / "run"),
            "--prompts_per_update", "2", "--num_mini_batches", "1", *flags]
    assert ppo_step.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: "), err
    assert not (tmp_path / "run").exists()


def test_ppo_step_with_mc_values_counts_its_rollout_tokens(policy_dir, tmp_path):
    out = tmp_path / "mc"
    argv = ["--advantage_estimator", "mc_values", "--reward", "gold", "--mc_rollouts", "2",
            "--policy", str(policy_dir), "--output_dir", str(out), "--build_missing", "false",
            "--num_updates", "2", "--prompts_per_update", "4", "--samples_per_prompt", "2", "--n_prompts", "8",
            "--max_new_tokens", "40", "--num_mini_batches", "2", "--ppo_epochs", "1", "--disable_tqdm", "true",
            "--eval_dataset", "none", "--n_probe", "0", "--num_threads", "1", "--save_steps", "0",
            "--report_to", "none"]
    assert ppo_step.main(argv) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    for m in lines:
        for key in ("loss/policy", "loss/kl", "policy/entropy"):
            assert math.isfinite(m[key]), (key, m)
        assert "loss/value" not in m  # no critic
        # every sampled token: the responses' and the continuations'
        assert m["rollout/tokens"] == pytest.approx(m["rollout/response_tokens"] * 8 + m["rollout/mc_tokens"])
    assert sum(m["rollout/mc_prefixes"] for m in lines) > 0 and sum(m["rollout/mc_tokens"] for m in lines) > 0
    assert json.loads((out / "eval.json").read_text())["advantage_estimator"] == "mc_values"


def test_a_run_stored_before_mc_rollouts_existed_resumes_with_the_default():
    from rl.run_dir import settings_changes

    old_run = {"learning_rate": 1e-3}  # written before --mc_rollouts existed (and so before mc_values)
    assert settings_changes(old_run, {"learning_rate": 1e-3, "mc_rollouts": 4}) == []
    assert settings_changes(old_run, {"learning_rate": 1e-3, "mc_rollouts": 8}) == ["mc_rollouts: 4 -> 8"]
