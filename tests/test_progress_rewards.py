"""Progress rewards (`--reward progress`, `gold+progress`; PAV): the arithmetic of a step's progress
(Q differences, Best-of-K, placement on step ends, the outcome plus alpha x progress), the prover's
Q values from continuations whose correctness the test decides, the telescoping of real sampled
progress, the settings refused, and short runs of `rl/ppo_step.py` with each prover."""

import json
import math

import pytest
import torch
from test_mc_values import batch_of, make_trainer, policy_dir  # noqa: F401  (policy_dir: a fixture)

from reasoning.stats import best_of_k
from reasoning.steps import join_steps
from rl import ppo_step
from rl.progress import place_progress, progress_stats, step_progress
from rl.reward_table import Responses, step_end_tokens

# ------------------------------------------------------------------------------------------------
# the arithmetic, on hand-built values


def test_best_of_k_is_the_chance_one_of_k_tries_is_right():
    assert best_of_k(3, 4, 1) == 0.75  # K = 1: the Monte Carlo mean
    # trials >= K: unbiased pass@K, 1 - C(m - c, K) / C(m, K)
    assert best_of_k(1, 4, 2) == pytest.approx(1 - 3 / 6)
    assert best_of_k(2, 4, 4) == 1.0 and best_of_k(0, 4, 4) == 0.0
    # trials < K: the plug-in 1 - (1 - q)^K
    assert best_of_k(1, 2, 4) == pytest.approx(1 - 0.5**4)
    assert best_of_k(1, 1, 8) == 1.0 and best_of_k(0, 1, 8) == 0.0  # a finished response is 0 or 1
    assert best_of_k(1, 3, 2) > best_of_k(1, 3, 1)  # more tries, more chance
    for bad in [(3, 2, 1), (0, 0, 1), (1, 2, 0), (-1, 2, 1)]:
        with pytest.raises(ValueError):
            best_of_k(*bad)


def test_step_progress_is_the_change_of_q_and_sums_to_its_ends():
    row = [0.5, 0.75, 0.25, 1.0]
    assert step_progress(row) == pytest.approx([0.25, -0.5, 0.75])
    assert sum(step_progress(row)) == pytest.approx(row[-1] - row[0])
    assert step_progress([1.0, 0.0]) == [-1.0]
    with pytest.raises(ValueError):
        step_progress([0.5])


def test_progress_is_placed_at_step_ends_beside_the_outcome():
    rewards = torch.zeros(2, 8)
    rewards[0, 6] = 1.0  # the answer check of response 0 at its last token (7 tokens)
    mask = torch.zeros(2, 8)
    mask[0, 6] = mask[1, 4] = 1.0
    q_rows = [[0.5, 0.25, 1.0], [0.5, 0.75, 0.0]]
    placed, marks = place_progress(rewards, mask, q_rows, [[2, 5], None], [7, 5], coef=0.5)
    want0 = [0, 0, 0.5 * -0.25, 0, 0, 0.5 * 0.75, 1.0, 0]
    assert placed[0].tolist() == pytest.approx(want0)
    # steps not located in the tokens: the summed progress at the last token
    assert placed[1].tolist() == pytest.approx([0, 0, 0, 0, 0.5 * -0.5, 0, 0, 0])
    assert marks[0].nonzero().flatten().tolist() == [2, 5, 6] and marks[1].nonzero().flatten().tolist() == [4]
    # the outcome plus alpha x progress: a response's total is R + alpha (Q(s_n) - Q(s_0))
    assert placed[0].sum().item() == pytest.approx(1.0 + 0.5 * (1.0 - 0.5))
    assert rewards[0, 2] == 0 and mask[0, 2] == 0  # the inputs are left as they were
    with pytest.raises(ValueError, match="2 steps of progress but 1 step ends"):
        place_progress(rewards, mask, q_rows[:1], [[2]], [7], coef=1.0)


def test_progress_stats_split_right_and_wrong_and_count_zero_steps():
    stats = progress_stats([[0.0, 0.5, 1.0, 1.0], [1.0, 0.0]], [1.0, 0.0])
    assert stats["progress/step_mean_right"] == pytest.approx(1 / 3)
    assert stats["progress/step_mean_wrong"] == -1.0
    assert stats["progress/zero_frac"] == 0.25
    assert stats["progress/q_start_mean"] == 0.5 and stats["progress/response_mean"] == 0.0


# ------------------------------------------------------------------------------------------------
# the prover's Q values, from continuations the test decides


def _scripted(trainer, tok, batch, script):
    """Replaces the sampler's continuations: a prefix holding d closed steps gets the next of
    `script[d]` (d = 0: a continuation of the prompt alone). Returns the calls' records."""
    eos = tok.eos_token_id
    prompt_len = int(batch.query_mask[0].sum())
    calls = []

    def fake(prefixes, budgets, prover="policy", copies=1, owners=None, expected=None):
        calls.append(prover)
        out = []
        for prefix in (p for p in prefixes for _ in range(copies)):
            done = tok.decode(prefix[prompt_len:], skip_special_tokens=True).count("</Step>")
            k = sum(1 for d in calls[1:] if d == done)
            calls.append(done)
            out.append(tok(script[done][k], add_special_tokens=False)["input_ids"] + [eos])
        return out, {"continuations/tokens": float(sum(len(c) for c in out))}

    trainer.sampler.sample_continuations = fake
    return calls


@pytest.mark.parametrize("prover, best_of, rows", [
    # policy: Q(s_0) the other sample's answer check (leave-one-out)
    ("policy", 1, [[0.0, 0.5, 1.0, 1.0], [1.0, 0.0]]),
    # sft: Q(s_0) from its own two continuations of the prompt, both wrong
    ("sft", 1, [[0.0, 0.5, 1.0, 1.0], [0.0, 0.0]]),
    # Best-of-2 of the policy: 1 of 2 right after step 1 is pass@2 = 1; the other sample's 0/1 stays
    ("policy", 2, [[0.0, 1.0, 1.0, 1.0], [1.0, 0.0]]),
])
def test_q_values_and_placed_progress_from_the_provers_continuations(policy_dir, tmp_path, prover, best_of,  # noqa: F811
                                                                     rows):
    trainer, tok, train = make_trainer(policy_dir, tmp_path, advantage_estimator="group", reward="gold+progress",
                                       progress_rollouts=2, progress_coef=0.5, prover=prover, prover_best_of=best_of)
    problem = train[0]
    right = join_steps([f"The answer is <ans>{problem.answer}</ans>."])
    wrong = join_steps([f"The answer is <ans>{int(problem.answer) + 1}</ans>."])
    three = join_steps(["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5.", f"The answer is <ans>{problem.answer}</ans>."])
    batch = batch_of(tok, [problem, problem], [three, wrong])  # one prompt, two samples: right, wrong
    calls = _scripted(trainer, tok, batch, {0: [wrong, wrong], 1: [right, wrong], 2: [right, right]})
    captured = []
    q_rows = trainer.sampler._q_rows
    trainer.sampler._q_rows = lambda *a: captured.append(q_rows(*a)) or captured[-1]
    scores, _ = trainer.rewards(batch)
    placed, stats = trainer.sampler.progress_rewards(batch, scores)
    assert calls[0] == prover
    assert sorted(calls[1:]) == ([0, 0] if prover == "sft" else []) + [1, 1, 2, 2]
    assert captured[0] == [pytest.approx(r) for r in rows]
    responses = Responses.of(batch.response_ids, batch.response_mask, batch.texts, tok)
    for i, row in enumerate(rows):
        ends = step_end_tokens(tok, responses.bodies[i], batch.texts[i], len(responses.paths[i].steps))
        added = (placed[i] - scores[i]).tolist()
        for end, a in zip(ends, step_progress(row)):
            assert added[end] == pytest.approx(0.5 * a) and batch.reward_mask[i, end] == 1
        assert sum(added) == pytest.approx(0.5 * (row[-1] - row[0]))  # telescoped
        last = int(batch.response_mask[i].sum()) - 1
        assert placed[i, last] == pytest.approx(scores[i, last])  # the answer check at the EOS, as it was
    every = [a for r in rows for a in step_progress(r)]
    assert stats["progress/zero_frac"] == pytest.approx(sum(a == 0 for a in every) / len(every))
    pieces = [right, wrong, right, right] + ([wrong, wrong] if prover == "sft" else [])
    assert stats["rollout/progress_tokens"] == sum(len(tok(s, add_special_tokens=False)["input_ids"]) + 1
                                                   for s in pieces)  # each continuation and its EOS


def test_segments_continue_from_fewer_boundaries_and_credit_each_segment(policy_dir, tmp_path):  # noqa: F811
    """--continuation_boundaries 1 on a four-step response: continued from its middle boundary only
    (after step 2), the two segments' progress placed at the ends of steps 2 and 4."""
    trainer, tok, train = make_trainer(policy_dir, tmp_path, advantage_estimator="group", reward="gold+progress",
                                       progress_rollouts=2, progress_coef=1.0, continuation_boundaries=1)
    problem = train[0]
    wrong = join_steps([f"The answer is <ans>{int(problem.answer) + 1}</ans>."])
    right = join_steps([f"The answer is <ans>{problem.answer}</ans>."])
    four = join_steps(["Ava has 3 + 4 = 7 apples.", "So 7 - 2 = 5.", "Then 5 + 0 = 5.",
                       f"The answer is <ans>{problem.answer}</ans>."])
    batch = batch_of(tok, [problem, problem], [four, wrong])
    calls = _scripted(trainer, tok, batch, {2: [right, wrong]})
    scores, _ = trainer.rewards(batch)
    placed, stats = trainer.sampler.progress_rewards(batch, scores)
    assert sorted(calls[1:]) == [2, 2]  # two continuations, both after the second step
    responses = Responses.of(batch.response_ids, batch.response_mask, batch.texts, tok)
    ends = step_end_tokens(tok, responses.bodies[0], batch.texts[0], len(responses.paths[0].steps))
    assert len(ends) == 4
    added = (placed[0] - scores[0]).tolist()
    # Q: 0 (the other sample is wrong), 0.5 after step 2, 1 at the end (right)
    assert added[ends[1]] == pytest.approx(0.5) and added[ends[3]] == pytest.approx(0.5)
    assert added[ends[0]] == 0 and added[ends[2]] == 0 and batch.reward_mask[0, ends[0]] == 0
    assert stats["rollout/progress_prefixes"] == 1.0


def test_the_sft_prover_is_the_frozen_reference(policy_dir, tmp_path):  # noqa: F811
    trainer, _, _ = make_trainer(policy_dir, tmp_path, advantage_estimator="group", reward="progress", prover="sft")
    with trainer.sampler.prover_for_generation("sft") as model:
        assert model is trainer.ref_policy
    with trainer.sampler.prover_for_generation("policy") as model:
        assert model is trainer._unwrapped_policy() and model is not trainer.ref_policy


def test_under_lora_the_sft_prover_is_the_base_with_its_adapters_off(policy_dir, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    trainer, tok, train = make_trainer(policy_dir, tmp_path, advantage_estimator="group", reward="progress",
                                       prover="sft", use_peft=True, lora_r=4)
    policy = trainer._unwrapped_policy()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # the adapters now move the policy away from its base
    ids = tok("<Step> Ava has 3 apples.", return_tensors="pt", add_special_tokens=False)["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(str(policy_dir)).eval()
    with torch.no_grad():
        want = base(input_ids=ids).logits
        assert not torch.allclose(policy(input_ids=ids).logits, want, atol=1e-4)
        with trainer.sampler.prover_for_generation("sft") as model:
            assert torch.allclose(model(input_ids=ids).logits, want, atol=1e-5)
        assert not torch.allclose(policy(input_ids=ids).logits, want, atol=1e-4)  # adapters back on after


# ------------------------------------------------------------------------------------------------
# real samples: progress telescopes


@pytest.mark.parametrize("prover", ["policy", "sft"])
def test_sampled_progress_sums_to_the_answer_check_less_the_start(policy_dir, tmp_path, prover):  # noqa: F811
    from reasoning.steps import answer_correct
    from rl import ppo_math as M

    trainer, _, _ = make_trainer(policy_dir, tmp_path, advantage_estimator="group", reward="gold+progress",
                                 progress_rollouts=2, progress_coef=0.3, prover=prover, prompts_per_update=4)
    captured = []
    q_rows = trainer.sampler._q_rows
    trainer.sampler._q_rows = lambda *a: captured.append(q_rows(*a)) or captured[-1]
    batch = trainer.sampler.generate(0)
    scores, _ = trainer.rewards(batch)
    placed, stats = trainer.sampler.progress_rewards(batch, scores)
    rows = captured[0]
    right = [float(answer_correct(t, p, "strict")) for t, p in zip(batch.texts, batch.problems)]
    added = (placed - scores).sum(-1).tolist()
    for i, row in enumerate(rows):
        assert row[-1] == right[i] and all(0.0 <= q <= 1.0 for q in row)
        assert added[i] == pytest.approx(0.3 * (row[-1] - row[0]), abs=1e-6)
    if prover == "policy":
        assert [r[0] for r in rows] == pytest.approx(M.leave_one_out_baseline(torch.tensor(right), 2).tolist())
    assert stats["rollout/progress_tokens"] > 0
    assert stats["reward/progress_mean"] == pytest.approx(sum(added) / len(added), abs=1e-6)
    assert 0.0 <= stats["progress/zero_frac"] <= 1.0


# ------------------------------------------------------------------------------------------------
# the flags


BASE = ["--output_dir", "RUN", "--prompts_per_update", "2", "--num_mini_batches", "1"]


@pytest.mark.parametrize("flags, message", [
    (["--reward", "gold+progress", "--use_vllm", "true"], "--reward gold+progress samples the prover's "
                                                          "continuations with --use_vllm false only"),
    (["--reward", "progress", "--gamma", "0.9"], "(--gamma 1), got --gamma 0.9"),
    (["--reward", "progress", "--reward_normalize", "true"], "--reward_normalize does not apply to --reward progress"),
    (["--reward", "progress", "--progress_rollouts", "0"], "--progress_rollouts must be >= 1, got 0"),
    (["--reward", "progress", "--prover_best_of", "0"], "--prover_best_of must be >= 1, got 0"),
    (["--reward", "progress", "--prover", "teacher"], "--prover must be one of policy, sft; got 'teacher'"),
    (["--reward", "gold", "--prover", "sft"], "--prover applies to --reward progress and gold+progress only"),
    (["--reward", "gold", "--progress_coef", "0.5"], "--progress_coef applies to --reward progress"),
    (["--reward", "gold+progress", "--advantage_estimator", "mc_values"], "needs --reward gold, got 'gold+progress'"),
    (["--reward", "gold", "--continuation_boundaries", "2"],
     "--continuation_boundaries applies to --advantage_estimator mc_values and --reward progress or gold+progress"),
    (["--reward", "progress", "--continuation_boundaries", "-1"], "--continuation_boundaries must be >= 0, got -1"),
    (["--reward", "progress", "--continuation_sampling", "shared", "--continuation_round_tokens", "32"],
     "--continuation_round_tokens applies to --continuation_sampling separate, got shared"),
    (["--reward", "progress", "--num_generations", "1", "--advantage_estimator", "gae"],
     "--prover policy values each prompt by its other samples: it needs --num_generations >= 2"),
])
def test_settings_progress_cannot_use_are_one_line_errors(tmp_path, capsys, flags, message):
    argv = [str(tmp_path / "run") if a == "RUN" else a for a in BASE] + flags
    assert ppo_step.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: "), err
    assert not (tmp_path / "run").exists()


def test_progress_rewards_default_to_own_step_credit():
    from rl.ppo_config import StepPPOConfig

    for reward in ("progress", "gold+progress"):
        args = StepPPOConfig(output_dir="unused", reward=reward, report_to="none")
        assert (args.reward_shaping, args.step_credit) == ("raw", "own")


# ------------------------------------------------------------------------------------------------
# a short run with each prover


@pytest.mark.parametrize("flags", [
    ["--reward", "gold+progress", "--prover", "policy"],
    ["--reward", "gold+progress", "--prover", "sft", "--progress_coef", "0.5"],
    ["--reward", "progress", "--prover", "sft", "--prover_best_of", "2"],
])
def test_ppo_step_with_progress_logs_its_tokens_and_stats(policy_dir, tmp_path, flags):  # noqa: F811
    out = tmp_path / "progress"
    argv = [*flags, "--progress_rollouts", "2", "--policy", str(policy_dir), "--output_dir", str(out),
            "--build_missing", "false", "--num_updates", "2", "--prompts_per_update", "4", "--samples_per_prompt", "2",
            "--n_prompts", "8", "--max_new_tokens", "40", "--num_mini_batches", "2", "--ppo_epochs", "1",
            "--disable_tqdm", "true", "--eval_dataset", "none", "--n_probe", "0", "--num_threads", "1",
            "--save_steps", "0", "--report_to", "none"]
    assert ppo_step.main(argv) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    coef = float(flags[flags.index("--progress_coef") + 1]) if "--progress_coef" in flags else 1.0
    for m in lines:
        for key in ("loss/policy", "progress/step_mean_right", "progress/step_mean_wrong", "progress/q_start_mean",
                    "time/progress"):
            assert math.isfinite(m[key]), (key, m)
        assert 0.0 <= m["progress/zero_frac"] <= 1.0 and 0.0 <= m["progress/q_start_mean"] <= 1.0
        assert abs(m["reward/progress_mean"]) <= coef + 1e-9
        # every sampled token: the responses' and the prover's continuations
        assert m["rollout/tokens"] == pytest.approx(m["rollout/response_tokens"] * 8 + m["rollout/progress_tokens"])
    if "sft" in flags:  # the prover continues every prompt: tokens every update
        assert all(m["rollout/progress_tokens"] > 0 for m in lines)
    assert sum(m["rollout/progress_tokens"] for m in lines) > 0
    assert json.loads((out / "eval.json").read_text())["reward"] == flags[1]
