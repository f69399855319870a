"""PRIME's implicit PRM: step rewards by hand, zero at initialisation, training on outcome labels,
the `implicit:PATH` spec, and the online update inside PPO."""

import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, corrupt_steps, generate
from reward_models.implicit_prm import (
    ImplicitPRM,
    ImplicitPRMConfig,
    encode_steps,
    load_for_training,
    main,
    train_implicit_prm,
)
from reward_models.verifier import layout

WORLD = WorldConfig(min_steps=2, max_steps=4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny policy (the reference) and a second tiny LM with other weights, one tokenizer."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("implicit")
    rows = generate("train", 120, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    policy = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    policy.save_pretrained(root / "policy")
    tok.save_pretrained(root / "policy")
    (root / "policy" / "world_config.json").write_text(json.dumps(WORLD.__dict__))
    other = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    return root, tok, policy.eval(), other.eval()


def outcome_rows(n_problems: int, seed: int = 0) -> list[dict]:
    """Per problem the gold path (answer right, label 1) and a corrupted one (label 0)."""
    rng = random.Random(seed)
    rows = []
    for r in generate("train", n_problems, seed, WORLD):
        rows.append({"id": f"{r['id']}/gold", "prompt": r["question"], "completions": r["steps"],
                     "answer_correct": True})
        steps, _, _ = corrupt_steps(r, rng)
        rows.append({"id": f"{r['id']}/bad", "prompt": r["question"], "completions": steps, "answer_correct": False})
    return rows


def hand_step_rewards(model, ref, tok, question, steps, beta):
    """beta * sum of log(pi/pi_ref) over the tokens of each step, from the logits of one unpadded
    sequence: a token belongs to the last step whose `<Step>` starts before the token ends."""
    lay = layout(question, steps)
    enc = tok(lay.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        lp_ref = torch.log_softmax(ref(input_ids=ids).logits[0].float(), -1)
    starts = [lay.text.rindex("<Step>", 0, end) for end in lay.step_end_chars]
    sums = [0.0] * len(steps)
    counted = 0
    for k in range(1, len(enc["input_ids"])):
        end = enc["offset_mapping"][k][1]
        owners = [j for j, s in enumerate(starts) if s < end]
        if not owners:
            continue  # the prompt
        t = enc["input_ids"][k]
        sums[owners[-1]] += (lp[k - 1, t] - lp_ref[k - 1, t]).item()
        counted += 1
    return [beta * s for s in sums], counted


def test_step_rewards_equal_beta_times_the_log_ratios_by_hand(models):
    root, tok, ref, other = models
    rows = generate("dev", 6, 0, WORLD)
    questions = [r["question"] for r in rows]
    paths = [r["steps"] for r in rows]
    assert len({len(layout(q, p).text) for q, p in zip(questions, paths)}) > 1  # padding is exercised
    prm = ImplicitPRM(other, ref, tok, beta=0.25, batch_size=4)
    got = prm.step_rewards(questions, paths)
    for q, p, g in zip(questions, paths, got):
        expected, counted = hand_step_rewards(other, ref, tok, q, p, 0.25)
        assert len(g) == len(p)
        assert g == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert any(abs(x) > 1e-3 for x in expected)  # the two models differ: the check can fail
        # every token after the prompt is owned by exactly one step, padding by none
        batch = encode_steps(tok, [q], [p])
        assert int((batch["token_step"] >= 0).sum()) == counted
    # batching and padding do not change the rewards
    single = ImplicitPRM(other, ref, tok, beta=0.25, batch_size=1).step_rewards(questions, paths)
    assert all(a == pytest.approx(b, rel=1e-4, abs=1e-6) for a, b in zip(got, single))
    # the score is sigmoid of the cumulative reward: the last step's is sigmoid(r(x, y))
    scores = prm.score(questions, paths)
    for s, r in zip(scores, got):
        assert s[-1] == pytest.approx(1 / (1 + math.exp(-sum(r))), rel=1e-6)
        assert s[0] == pytest.approx(1 / (1 + math.exp(-r[0])), rel=1e-6)
        assert all(0.0 <= x <= 1.0 for x in s)


def test_token_step_marks_each_steps_tokens_and_padding():
    """`token_step` puts each token under the step whose tag text it carries; padding is -1."""
    from reasoning.tokenizer import train_tokenizer

    tok = train_tokenizer([solve_prompt("Q?") + join_steps(["a b", "c d e"])] * 3, vocab_size=300)
    batch = encode_steps(tok, ["Q?", "Q?"], [["a b", "c d e"], ["a b"]])
    for row in range(2):
        ids = batch["input_ids"][row].tolist()
        owner = batch["token_step"][row].tolist()
        n = int(batch["attention_mask"][row].sum())
        assert all(o == -1 for o in owner[n:])  # padding
        texts = {j: tok.decode([i for i, o in zip(ids, owner) if o == j]) for j in set(owner) if j >= 0}
        assert "a b" in texts[0] and "</Step>" in texts[0] and "c" not in texts[0]
        if row == 0:
            assert "c d e" in texts[1] and "a" not in texts[1]
        assert owner[0] == -1 and "Question" not in "".join(texts.values())


def test_rewards_are_exactly_zero_at_initialisation(models):
    root, *_ = models
    prm = load_for_training(str(root / "policy"), beta=0.05)
    rows = generate("dev", 5, 0, WORLD)
    rewards = prm.step_rewards([r["question"] for r in rows], [r["steps"] for r in rows])
    assert all(x == 0.0 for r in rewards for x in r) and all(len(r) > 0 for r in rewards)
    assert all(s == 0.5 for p in prm.score([r["question"] for r in rows], [r["steps"] for r in rows]) for s in p)


def test_training_separates_right_from_wrong_and_the_spec_loads_it(models, tmp_path):
    from reward_models.load import check_spec, load_verifier

    root, *_ = models
    rows = outcome_rows(12)
    out = tmp_path / "prm"
    cfg = ImplicitPRMConfig(data="rows", init_from=str(root / "policy"), output_dir=str(out), beta=0.1,
                            learning_rate=3e-3, max_steps=12, batch_size=8)
    summary = train_implicit_prm(rows, cfg)
    assert summary["loss_after"] < summary["loss_before"] == pytest.approx(math.log(2), rel=1e-6)
    assert summary["tokens_read"] > 0 and summary["train_seconds"] >= 0
    saved = json.loads((out / "implicit_prm.json").read_text())
    assert saved["beta"] == 0.1 and saved["reference_local"] is True
    assert (out / saved["reference"]).resolve() == (root / "policy").resolve()  # relative to the PRM folder
    assert saved["reference_absolute"] == str((root / "policy").resolve())
    assert (out / "world_config.json").exists()
    check_spec(f"implicit:{out}")
    prm = load_verifier(f"implicit:{out}")
    assert isinstance(prm, ImplicitPRM) and prm.beta == 0.1
    last = [s[-1] for s in prm.score([r["prompt"] for r in rows], [r["completions"] for r in rows])]
    right = [s for s, r in zip(last, rows) if r["answer_correct"]]
    wrong = [s for s, r in zip(last, rows) if not r["answer_correct"]]
    # from 0.5 for every row at the start: sigmoid(r) rose on the label-1 rows and fell on the label-0 ones
    assert sum(right) / len(right) > 0.5 > sum(wrong) / len(wrong), (right, wrong)
    assert sum(a > b for a, b in zip(right, wrong)) >= 0.75 * len(right)  # each gold path above its corruption


def test_spec_errors_are_one_line(models, tmp_path):
    from reward_models.load import check_spec, load_verifier

    root, *_ = models
    for spec, match in ((f"implicit:{tmp_path / 'nope'}", "no such directory"),
                        (f"implicit:{root / 'policy'}", "no implicit_prm.json"),
                        ("implicit:", "name the implicit PRM folder")):
        for call in (check_spec, load_verifier):
            with pytest.raises(ValueError, match=match) as err:
                call(spec)
            assert "\n" not in str(err.value)
    moved = tmp_path / "prm"
    moved.mkdir()
    (moved / "implicit_prm.json").write_text(json.dumps({"beta": 0.05, "reference": str(tmp_path / "gone")}))
    with pytest.raises(ValueError, match="its reference .*gone is missing or not a saved model"):
        check_spec(f"implicit:{moved}")
    (moved / "implicit_prm.json").write_text(json.dumps({"beta": 0.05, "reference": "org/policy"}))
    check_spec(f"implicit:{moved}")  # a Hub id is checked when it loads
    with pytest.raises(ValueError, match=f"is an implicit PRM: name it implicit:{moved}"):
        (moved / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        check_spec(str(moved))


def test_cli_trains_and_reports_bad_rows(models, tmp_path, capsys):
    root, *_ = models
    data = tmp_path / "rows.jsonl"
    rows = outcome_rows(3)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "prm"
    assert main(["--data", str(data), "--init_from", str(root / "policy"), "--output_dir", str(out),
                 "--max_steps", "1", "--batch_size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == len(rows)
    bad = dict(rows[1], answer_correct="yes")
    data.write_text(json.dumps(rows[0]) + "\n" + json.dumps(bad) + "\n")
    assert main(["--data", str(data), "--init_from", str(root / "policy"), "--output_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {data}:2: row 1 (id {bad['id']!r}): field 'answer_correct' must be true/false "
                   "(the answer check), got 'yes'")
    assert not (tmp_path / "x").exists()


def test_online_update_moves_the_prm_and_never_the_reference(models):
    root, *_ = models
    prm = load_for_training(str(root / "policy"), beta=0.1)
    ref_before = {k: v.clone() for k, v in prm.ref.state_dict().items()}
    model_before = {k: v.clone() for k, v in prm.model.state_dict().items()}
    rows = outcome_rows(4)
    got = prm.online_update([r["prompt"] for r in rows], [r["completions"] for r in rows],
                            [float(r["answer_correct"]) for r in rows], steps=2, learning_rate=1e-3, batch_size=3)
    assert got["loss"] == pytest.approx(math.log(2), rel=1e-6) and got["seconds"] > 0
    assert any(not torch.equal(v, prm.model.state_dict()[k]) for k, v in model_before.items())
    assert all(torch.equal(v, prm.ref.state_dict()[k]) for k, v in ref_before.items())
    assert not any(p.requires_grad for p in prm.ref.parameters())
    assert any(x != 0.0 for r in prm.step_rewards([rows[0]["prompt"]], [rows[0]["completions"]]) for x in r)


def test_ppo_online_update_flag(models, tmp_path):
    """--verifier_online_update needs an implicit verifier (ConfigError otherwise); with one, each
    update trains it on the rollouts, logs the seconds, and the run saves the updated PRM."""
    from rl.ppo_cli import parse_config
    from rl.ppo_config import ConfigError, StepPPOConfig
    from rl.ppo_setup import load_policy, load_problems
    from rl.ppo_trainer import StepPPOTrainer

    root, *_ = models
    with pytest.raises(ConfigError, match="--verifier_online_update trains an implicit PRM"):
        parse_config(["--verifier_online_update", "true", "--verifier", "exact"])
    prm_dir = tmp_path / "prm"
    load_for_training(str(root / "policy"), beta=0.1).save_pretrained(str(prm_dir))
    with pytest.raises(ConfigError, match="verifier reward"):
        parse_config(["--verifier_online_update", "true", "--verifier", f"implicit:{prm_dir}", "--reward", "gold"])
    args = parse_config(["--verifier_online_update", "true", "--verifier", f"product:implicit:{prm_dir},exact",
                         "--reward", "step+gold"])
    assert args.verifier_online_update
    args = StepPPOConfig(output_dir=str(tmp_path / "run"), model_name_or_path=str(root / "policy"),
                         verifier=f"implicit:{prm_dir}",
                         build_missing=False, n_prompts=4, prompts_per_update=2, num_generations=2,
                         max_completion_length=24, num_mini_batches=2, report_to="none", disable_tqdm=True,
                         max_steps=1, n_probe=0, save_steps=0, reward="outcome", verifier_online_update=True,
                         verifier_online_learning_rate=1e-3)
    from reward_models.load import load_verifier

    verifier = load_verifier(args.verifier)
    before = {k: v.clone() for k, v in verifier.model.state_dict().items()}
    train, _ = load_problems("world", args.n_prompts, args, "train")
    policy, tok = load_policy(args)
    trainer = StepPPOTrainer(args, policy, tok, None, verifier, train, [])
    trainer.sampler.generate = lambda update: _rollouts_with_steps(trainer, tok, train[:2])
    trainer.train()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["time/verifier_update"] > 0 and metrics[-1]["verifier/online_paths"] == 4
    assert any(not torch.equal(v, verifier.model.state_dict()[k]) for k, v in before.items())
    saved = load_verifier(f"implicit:{tmp_path / 'run' / 'implicit_prm'}")
    assert all(torch.equal(v, saved.model.state_dict()[k].to(v.dtype)) for k, v in verifier.model.state_dict().items())
    # a resumed run continues from the checkpoint's PRM (weights and optimiser), not the spec's
    fresh = load_verifier(args.verifier)
    resumed = StepPPOTrainer(args, load_policy(args)[0], tok, None, fresh, train, [])
    resumed.load_checkpoint(tmp_path / "run" / "checkpoint-1")
    assert all(torch.equal(v, fresh.model.state_dict()[k]) for k, v in verifier.model.state_dict().items())
    assert fresh.optimizer is not None and fresh.optimizer.state_dict()["state"]
    with pytest.raises(ValueError, match="needs an implicit PRM verifier"):
        StepPPOTrainer(args, policy, tok, None, None, train, [])



def _rollouts_with_steps(trainer, tok, problems):
    """Two samples per problem: the gold solution and a corrupted one."""
    from test_ppo import rollouts_from_texts

    rng = random.Random(0)
    texts, probs = [], []
    for p in problems:
        bad, _, _ = corrupt_steps(p, rng)
        texts += [join_steps(p.meta["steps"]), join_steps(bad)]
        probs += [p, p]
    return rollouts_from_texts(trainer, tok, probs, texts)[0]


def test_outcome_annotation_feeds_the_implicit_prm(models, tmp_path):
    """`annotate --method outcome` samples paths with no rollout and labels every step with the
    path's answer check; its rows train the implicit PRM as they are."""
    from test_annotate import ScriptedGenerator, check_schema, config, read_rows

    from reasoning.world import row_to_problem
    from reward_models import annotate as ann

    root, *_ = models
    world = generate("train", 4, 1, WORLD)
    gen = ScriptedGenerator(world)  # even paths the gold solution, odd ones a wrong step and answer
    summary = ann.annotate(config(tmp_path, "outcome", paths_per_problem=2), gen,
                           [row_to_problem(r) for r in world])
    rows = read_rows(tmp_path / "outcome.jsonl")
    check_schema(rows, "outcome")
    assert gen.calls == 1 and summary["generated_tokens"] > 0 and "seconds" in summary  # no rollout
    assert [r["answer_correct"] for r in rows] == [True, False] * 4
    assert all(r["labels"] == [float(r["answer_correct"])] * len(r["completions"]) for r in rows)
    cfg = ImplicitPRMConfig(data="rows", init_from=str(root / "policy"), output_dir=str(tmp_path / "prm"),
                            max_steps=1, batch_size=4)
    assert train_implicit_prm(rows, cfg)["rows"] == 8


def test_training_logs_the_label_balance_and_the_loss(models, tmp_path, capsys):
    root, *_ = models
    rows = outcome_rows(3)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rows.jsonl.meta.json").write_text(json.dumps({"method": "outcome", "answer_match": "flexible"}))
    assert main(["--data", str(data), "--init_from", str(root / "policy"), "--output_dir", str(tmp_path / "prm"),
                 "--max_steps", "5", "--batch_size", "2", "--logging_steps", "2", "--disable_tqdm", "true"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout: the summary alone
    lines = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    start, *logged = lines
    assert start == {"implicit_prm": "start", "rows": 6, "right": 3, "wrong": 3, "label_mean": 0.5,
                     "answer_match": "flexible", "skipped_rows": 0, "steps": 5, "batch_size": 2}
    assert [e["step"] for e in logged] == [2, 4, 5] and all(e["of"] == 5 and e["loss"] > 0 for e in logged)
    saved = json.loads((tmp_path / "prm" / "implicit_prm.json").read_text())
    assert saved["training"]["log_history"] == logged and saved["data"]["answer_match"] == "flexible"
    # one label only: said at the start
    data.write_text("".join(json.dumps(dict(r, answer_correct=True)) + "\n" for r in rows))
    assert main(["--data", str(data), "--init_from", str(root / "policy"), "--output_dir", str(tmp_path / "p2"),
                 "--max_steps", "1", "--disable_tqdm", "true"]) == 0
    assert "every row is labelled right" in capsys.readouterr().err


def _trained_tree(models, tree, monkeypatch):
    """tree/policy (a copy of the tiny policy) and tree/prm, an implicit PRM on it trained for one step,
    both named by paths relative to the working directory, `tree`'s parent."""
    root, *_ = models
    monkeypatch.chdir(tree.parent)
    shutil.copytree(root / "policy", tree / "policy")
    cfg = ImplicitPRMConfig(data="rows", init_from=f"{tree.name}/policy", output_dir=f"{tree.name}/prm",
                            max_steps=1, batch_size=4, disable_tqdm=True)
    train_implicit_prm(outcome_rows(2), cfg)
    return tree / "prm"


def test_the_reference_survives_another_working_directory_and_a_moved_tree(models, tmp_path, monkeypatch):
    from reward_models.load import check_spec, load_verifier

    rows = outcome_rows(2)
    prm_dir = _trained_tree(models, tmp_path / "tree", monkeypatch)
    saved = json.loads((prm_dir / "implicit_prm.json").read_text())
    assert saved["reference"] == "../policy" and saved["reference_local"] is True
    def scores_of(prm):  # every step's score, flat
        return [s for path in prm.score([r["prompt"] for r in rows], [r["completions"] for r in rows]) for s in path]

    scores = scores_of(ImplicitPRM.from_pretrained(str(prm_dir)))
    # from another working directory, by an absolute or a relative path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for spec in (str(prm_dir), os.path.relpath(prm_dir, elsewhere)):
        check_spec(f"implicit:{spec}")
        prm = load_verifier(f"implicit:{spec}")
        assert Path(prm.reference_path).resolve() == (tmp_path / "tree" / "policy").resolve()
        assert scores_of(prm) == pytest.approx(scores)
    # the whole tree moved: the relative reference follows it
    shutil.move(str(tmp_path / "tree"), str(tmp_path / "moved"))
    prm = ImplicitPRM.from_pretrained(str(tmp_path / "moved" / "prm"))
    assert Path(prm.reference_path).resolve() == (tmp_path / "moved" / "policy").resolve()
    assert scores_of(prm) == pytest.approx(scores)
    # saved again from there, it names the reference relative to its new place
    prm.save_pretrained(str(tmp_path / "moved" / "prm_again"))
    again = json.loads((tmp_path / "moved" / "prm_again" / "implicit_prm.json").read_text())
    assert again["reference"] == "../policy" and again["reference_absolute"] == str(tmp_path / "moved" / "policy")
    # the PRM folder moved alone: its stored absolute path still finds the reference
    shutil.move(str(tmp_path / "moved" / "prm_again"), str(tmp_path / "prm_alone"))
    check_spec(f"implicit:{tmp_path / 'prm_alone'}")
    prm = ImplicitPRM.from_pretrained(str(tmp_path / "prm_alone"))
    assert prm.reference_path == str(tmp_path / "moved" / "policy")
    # neither there: one line naming where it looked
    shutil.move(str(tmp_path / "moved" / "policy"), str(tmp_path / "policy_gone"))
    with pytest.raises(ValueError, match="its reference .*policy is missing or not a saved model"):
        check_spec(f"implicit:{tmp_path / 'prm_alone'}")


def test_a_file_with_an_absolute_reference_still_loads(models, tmp_path, monkeypatch):
    prm_dir = _trained_tree(models, tmp_path / "tree", monkeypatch)
    cfg = json.loads((prm_dir / "implicit_prm.json").read_text())
    old = {k: v for k, v in cfg.items() if k not in ("reference_local", "reference_absolute")}
    old["reference"] = str((tmp_path / "tree" / "policy").resolve())  # as files were written before
    (prm_dir / "implicit_prm.json").write_text(json.dumps(old))
    prm = ImplicitPRM.from_pretrained(str(prm_dir))
    assert prm.reference_path == old["reference"]
