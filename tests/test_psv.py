"""The PSV model and its training: prefix-only scores, batching, save/load, loss, bad rows."""

import json
import random

import pytest
import torch
import yaml

from reasoning.prompts import solve_prompt
from reasoning.steps import join_steps
from reasoning.world import WorldConfig, corrupt_steps, generate
from reward_models import train as psv_train
from reward_models.psv import PSVVerifier, encode_paths, init_psv_from_policy, load_psv_model, step_logits
from reward_models.train import (
    BadRowError,
    PSVArguments,
    PSVCollator,
    load_for_training,
    psv_loss,
    step_weights,
    train_verifier,
    validate_rows,
)

WORLD = WorldConfig(min_steps=2, max_steps=4)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A tiny untrained Llama policy and a BPE tokenizer trained on world text, saved offline."""
    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    out = tmp_path_factory.mktemp("policy")
    rows = generate("train", 120, 0, WORLD)
    tok = train_tokenizer([solve_prompt(r["question"]) + join_steps(r["steps"]) for r in rows], vocab_size=300)
    model = build_tiny_causal_lm(tok, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def stepwise_rows(n_problems: int, seed: int = 0) -> list[dict]:
    """Exact labels: a gold path (all 1) and a corrupted one (1 before the error, 0 from it) per problem."""
    rng = random.Random(seed)
    rows = []
    for r in generate("train", n_problems, seed, WORLD):
        rows.append({"id": f"{r['id']}/gold", "prompt": r["question"], "completions": r["steps"],
                     "labels": [1.0] * len(r["steps"])})
        steps, at, _ = corrupt_steps(r, rng)
        rows.append({"id": f"{r['id']}/bad", "prompt": r["question"], "completions": steps,
                     "labels": [1.0 if k < at else 0.0 for k in range(len(steps))]})
    return rows


def sharpened_psv(policy_dir):
    """A fresh PSV with a larger random head, so scores vary visibly from position to position."""
    model, tok = init_psv_from_policy(str(policy_dir))
    torch.manual_seed(0)
    with torch.no_grad():
        model.score.weight.copy_(0.5 * torch.randn_like(model.score.weight))
        model.score.bias.zero_()
    return model.eval(), tok


def test_one_pass_scores_equal_per_prefix_scores(policy_dir):
    model, tok = sharpened_psv(policy_dir)
    verifier = PSVVerifier(model, tok, batch_size=4)
    rows = stepwise_rows(4)
    questions, paths = [r["prompt"] for r in rows], [r["completions"] for r in rows]
    one_pass = verifier.score(questions, paths)
    flat = [s for path in one_pass for s in path]
    assert torch.tensor(flat).std() > 1e-3  # the comparison below is not between constants
    for q, path, scores in zip(questions, paths, one_pass):
        prefix_scores = verifier.score([q] * len(path), [path[: k + 1] for k in range(len(path))])
        per_prefix = [s[-1] for s in prefix_scores]
        assert max(abs(a - b) for a, b in zip(scores, per_prefix)) < 1e-4
        # And a step's score ignores what follows: change the last step, earlier scores stay.
        changed = verifier.score([q], [path[:-1] + ["The answer is <ans>999</ans>."]])[0]
        assert max(abs(a - b) for a, b in zip(scores[:-1], changed[:-1])) < 1e-4


def test_batching_and_padding_do_not_change_scores(policy_dir):
    model, tok = sharpened_psv(policy_dir)
    rows = stepwise_rows(5)
    questions, paths = [r["prompt"] for r in rows], [r["completions"] for r in rows]
    assert len({len(p) for p in paths}) > 1
    alone = PSVVerifier(model, tok, batch_size=1).score(questions, paths)
    together = PSVVerifier(model, tok, batch_size=len(paths)).score(questions, paths)
    reversed_ = PSVVerifier(model, tok, batch_size=3).score(questions[::-1], paths[::-1])[::-1]
    for a, b, c in zip(alone, together, reversed_):
        assert len(a) == len(b) == len(c)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
        assert max(abs(x - y) for x, y in zip(a, c)) < 1e-5


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_round_trip(policy_dir, tmp_path, lora):
    model, tok, facts = load_for_training(PSVArguments(init_from=str(policy_dir), lora=lora, lora_r=4))
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    rows = stepwise_rows(3)
    questions, paths = [r["prompt"] for r in rows], [r["completions"] for r in rows]
    before = PSVVerifier(model, tok).score(questions, paths)
    PSVVerifier(model, tok).save_pretrained(str(tmp_path / "psv"))
    if lora:
        config = json.loads((tmp_path / "psv" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(policy_dir.resolve())
    loaded, loaded_tok = load_psv_model(str(tmp_path / "psv"))
    assert type(loaded).__name__ == ("PeftModelForTokenClassification" if lora else "LlamaForTokenClassification")
    after = PSVVerifier(loaded, loaded_tok).score(questions, paths)
    assert max(abs(a - b) for x, y in zip(before, after) for a, b in zip(x, y)) < 1e-6
    assert facts["init_kind"] == "policy" and facts["new_weights"] == ["score.bias", "score.weight"]


def test_train_verifier_lowers_the_loss(policy_dir, tmp_path):
    rows = stepwise_rows(20)
    assert len(rows) == 40
    out = train_verifier(rows, str(policy_dir), str(tmp_path / "psv"), max_steps=30, learning_rate=3e-3,
                         per_device_train_batch_size=8)
    config = json.loads((tmp_path / "psv" / "psv_config.json").read_text())
    assert out == str(tmp_path / "psv")
    assert config["loss_probe"]["after"] < config["loss_probe"]["before"]
    assert config["training"]["global_steps"] == 30
    assert config["data"]["rows"] == 40 and config["data"]["skipped_rows"] == 0
    assert config["loss"] == "mse" and config["lora"] is False and config["outcome_only"] is False
    scores = PSVVerifier.from_pretrained(out, device="cpu").score([rows[0]["prompt"]], [rows[0]["completions"]])
    assert len(scores[0]) == len(rows[0]["completions"])


def test_lora_training_from_a_relative_path_saves_an_absolute_base(policy_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(policy_dir.parent)
    out = train_verifier(stepwise_rows(4), policy_dir.name, str(tmp_path / "lora"), lora=True, lora_r=4,
                         max_steps=2, loss="bce", label_balance=True)
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(policy_dir.resolve())
    assert "score" in config["modules_to_save"]
    psv_config = json.loads((tmp_path / "lora" / "psv_config.json").read_text())
    assert psv_config["lora"] is True and psv_config["lora_r"] == 4 and psv_config["loss"] == "bce"
    monkeypatch.chdir(tmp_path)
    verifier = PSVVerifier.from_pretrained(out, device="cpu")
    assert len(verifier.score(["Ava has 3 cards. How many cards does Ava have?"],
                              [["The answer is <ans>3</ans>."]])[0]) == 1


BAD_ROWS = [
    ({"completions": [], "labels": []}, "zero steps"),
    ({"completions": ["Ava has 3 cards.", "  "], "labels": [1.0, 1.0]}, "step 1 is empty"),
    ({"completions": ["Ava has 3 cards."], "labels": [1.5]}, "outside [0, 1]"),
    ({"completions": ["Ava has 3 cards."], "labels": [-0.1]}, "outside [0, 1]"),
    ({"completions": ["Ava has 3 cards.", "The answer is 3."], "labels": [1.0]}, "2 completions but 1 labels"),
    ({"completions": ["Ava has 3 cards."], "labels": ["yes"]}, "not a number"),
    ({"completions": ["Ava has 3 cards."], "labels": [None]}, "not a number"),
    ({"completions": ["Ava has 3 cards."], "labels": [float("nan")]}, "outside [0, 1]"),
    ({"completions": "Ava has 3 cards.", "labels": [1.0]}, "must be a list"),
    ({"prompt": "", "completions": ["Ava has 3 cards."], "labels": [1.0]}, "prompt"),
]


@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_bad_rows_raise_an_error_naming_the_row(bad, message):
    rows = stepwise_rows(2)
    rows.insert(3, {"id": "the-bad-one", "prompt": "Ava has 3 cards. How many?", **bad})
    with pytest.raises(BadRowError) as err:
        validate_rows(rows)
    assert "row 3" in str(err.value) and "the-bad-one" in str(err.value) and message in str(err.value)
    clean, skipped = validate_rows(rows, skip_bad_rows=True)
    assert len(clean) == 4 and skipped == [{"index": 3, "id": "the-bad-one", "reason": skipped[0]["reason"]}]


def test_boolean_labels_count_as_zero_and_one():
    clean, _ = validate_rows([{"prompt": "q", "completions": ["a", "b"], "labels": [True, False]}])
    assert clean[0]["labels"] == [1.0, 0.0]


def test_bad_and_too_long_rows_in_training(policy_dir, tmp_path):
    rows = stepwise_rows(3)
    with pytest.raises(BadRowError, match="row 2"):
        train_verifier(rows[:2] + [{"id": "x", "prompt": "q", "completions": ["a"], "labels": [2]}],
                       str(policy_dir), str(tmp_path / "a"), max_steps=1)
    with pytest.raises(BadRowError, match=r"row 0 \(id .*longer than the model's context \(40\)"):
        train_verifier(rows, str(policy_dir), str(tmp_path / "b"), max_steps=1, max_length=40)
    rows.append({"id": "bad", "prompt": "q", "completions": [""], "labels": [1]})
    train_verifier(rows, str(policy_dir), str(tmp_path / "c"), max_steps=1, skip_bad_rows=True)
    data = json.loads((tmp_path / "c" / "psv_config.json").read_text())["data"]
    assert data["rows"] == 6 and data["skipped_rows"] == 1 and data["bad_rows"][0]["id"] == "bad"


def test_outcome_only_puts_the_loss_on_the_last_step(policy_dir):
    model, tok = sharpened_psv(policy_dir)
    rows = stepwise_rows(3)
    weights = step_weights([r["labels"] for r in rows], outcome_only=True)
    assert all(w[:-1] == [0.0] * (len(w) - 1) and w[-1] == 1.0 for w in weights)
    features = [{**r, "weights": w} for r, w in zip(rows, weights)]
    batch = PSVCollator(tok)(features)
    _, positions = encode_paths(tok, [r["prompt"] for r in rows], [r["completions"] for r in rows], None)
    nonzero = [torch.nonzero(batch["step_weights"][i]).flatten().tolist() for i in range(len(rows))]
    assert nonzero == [[pos[-1]] for pos in positions]
    # The gradient reaches the logits at the last step end only (eval mode: the head's dropout off).
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    logits.retain_grad()
    psv_loss(logits, batch["step_targets"], batch["step_weights"], "mse").backward()
    for i, pos in enumerate(positions):
        grad = logits.grad[i]
        assert grad[pos[-1]].abs() > 0
        assert grad[[p for p in range(grad.numel()) if p != pos[-1]]].abs().max() == 0
    # And it equals the loss computed on the last steps alone.
    with torch.no_grad():
        per_path = step_logits(model, {k: batch[k] for k in ("input_ids", "attention_mask")}, positions)
        expected = torch.stack([(torch.sigmoid(lg[-1]) - r["labels"][-1]) ** 2 for lg, r in zip(per_path, rows)])
        got = psv_loss(logits.detach(), batch["step_targets"], batch["step_weights"], "mse")
    assert torch.allclose(got, expected.mean(), atol=1e-6)


def test_label_balance_gives_both_groups_equal_weight():
    labels = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.2]]
    weights = step_weights(labels, label_balance=True)
    pos = sum(w for ls, ws in zip(labels, weights) for y, w in zip(ls, ws) if y >= 0.5)
    neg = sum(w for ls, ws in zip(labels, weights) for y, w in zip(ls, ws) if y < 0.5)
    assert pos == pytest.approx(neg) and pos + neg == pytest.approx(7)
    assert step_weights([[1.0, 1.0]], label_balance=True) == [[1.0, 1.0]]


def test_cli_with_yaml_config(policy_dir, tmp_path, capsys):
    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in stepwise_rows(4)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"loss": "bce", "outcome_only": True, "max_steps": 2, "learning_rate": 0.002}))
    code = psv_train.main(["--config", str(cfg), "--data", str(data), "--init_from", str(policy_dir),
                           "--output_dir", str(tmp_path / "v"), "--disable_tqdm", "true"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == 8 and summary["output_dir"] == str(tmp_path / "v")
    assert {"steps", "label_mean", "train_seconds"} <= set(summary)
    config = json.loads((tmp_path / "v" / "psv_config.json").read_text())
    assert config["loss"] == "bce" and config["outcome_only"] is True and config["training"]["global_steps"] == 2
    assert config["data"]["supervised_steps"] == 8


def test_cli_reports_bad_data(policy_dir, tmp_path, capsys):
    data = tmp_path / "steps.jsonl"
    data.write_text(json.dumps(stepwise_rows(1)[0]) + "\n" + '{"id": "z", "prompt": "q", "completions": ["a"]}\n')
    code = psv_train.main(["--data", str(data), "--init_from", str(policy_dir), "--output_dir", str(tmp_path / "v")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{data}:2: row 1 (id 'z')" in err


def test_training_continues_from_a_saved_psv(policy_dir, tmp_path):
    rows = stepwise_rows(3)
    full = train_verifier(rows, str(policy_dir), str(tmp_path / "full"), max_steps=1)
    again = train_verifier(rows, full, str(tmp_path / "again"), max_steps=1)
    assert json.loads((tmp_path / "again" / "psv_config.json").read_text())["init_kind"] == "psv"
    lora = train_verifier(rows, str(policy_dir), str(tmp_path / "lora"), lora=True, lora_r=4, max_steps=1)
    more = train_verifier(rows, lora, str(tmp_path / "more"), lora=True, max_steps=1)
    merged = train_verifier(rows, lora, str(tmp_path / "merged"), max_steps=1)
    config = json.loads((tmp_path / "more" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(policy_dir.resolve())
    assert (tmp_path / "merged" / "model.safetensors").exists()
    question, path = rows[1]["prompt"], rows[1]["completions"]
    for out in (again, more, merged):
        assert len(PSVVerifier.from_pretrained(out, device="cpu").score([question], [path])[0]) == len(path)


def test_training_twice_gives_identical_losses(policy_dir, tmp_path):
    """The score head is drawn after seeding: the same command gives the same losses and weights."""
    from safetensors.torch import load_file

    rows = stepwise_rows(4)
    runs = []
    for name in ("a", "b"):
        torch.manual_seed(len(name) * 1000 + ord(name))  # whatever state the process was in before
        out = train_verifier(rows, str(policy_dir), str(tmp_path / name), max_steps=3, seed=7)
        runs.append(json.loads((tmp_path / name / "psv_config.json").read_text()))
        runs[-1]["weights"] = load_file(str(tmp_path / name / "model.safetensors"))
        assert out == str(tmp_path / name)
    (a, b) = runs
    assert a["loss_probe"] == b["loss_probe"] and a["training"]["train_loss"] == b["training"]["train_loss"]
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])


def test_cli_init_from_a_missing_path_is_one_line(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in stepwise_rows(1)))
    code = psv_train.main(["--data", str(data), "--init_from", "/nonexistent", "--output_dir", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert code == 2 and err == "error: --init_from /nonexistent: no such model directory\n"
