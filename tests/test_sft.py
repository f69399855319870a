"""The SFT script end to end on a tiny budget: trains, saves, reloads, evaluates."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.backends.base import SamplingParams, cut_at_stop
from inference.backends.hf import HFGenerator
from rl import sft


@pytest.mark.slow
def test_sft_tiny_run(tmp_path):
    out = tmp_path / "policy"
    code = sft.main([
        "--output_dir", str(out), "--n_train", "64", "--n_eval", "8", "--max_steps", "3",
        "--per_device_train_batch_size", "8", "--hidden_size", "32", "--num_layers", "1", "--num_heads", "2",
        "--vocab_size", "300", "--max_new_tokens", "24", "--disable_tqdm", "true",
    ])
    assert code == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["n"] == 8 and 0.0 <= result["greedy_accuracy"] <= 1.0
    assert result["correct"] == round(result["greedy_accuracy"] * 8)
    assert result["world_config"]["max_steps"] >= 1
    rows = [json.loads(line) for line in (out / "eval_rows.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all("error_kind" in r for r in rows)
    assert (out / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok)
    gen = HFGenerator(model.eval(), tok, batch_size=4)
    (c,), (d,) = gen.generate(["Question: Ava has 3 apples.", "Question:"], SamplingParams(max_new_tokens=5))
    assert c.prompt_tokens > d.prompt_tokens and 1 <= c.completion_tokens <= 5
    assert c.finish_reason in ("stop", "length")


def test_sft_rejects_bad_task_mixture(tmp_path, capsys):
    code = sft.main(["--output_dir", str(tmp_path), "--tasks", "solve=1,dance=2"])
    assert code == 2 and "dance" in capsys.readouterr().err


def test_cut_at_stop():
    assert cut_at_stop("a</Step>b</Step>", ("</Step>",)) == ("a</Step>", True)
    assert cut_at_stop("abc", ("</Step>",)) == ("abc", False)
    assert SamplingParams(stop=["x"]).stop == ("x",)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    torch.manual_seed(0)


def test_shipped_recipe_is_the_embedded_default():
    from pathlib import Path

    from trl import TrlParser

    recipe = Path(__file__).resolve().parents[1] / "configs" / "sft" / "tiny_world.yaml"
    parser = TrlParser((sft.WorldSFTArguments, sft.WorldSFTConfig))
    from_yaml = parser.parse_args_and_config(args=["--config", str(recipe)])
    default = parser.parse_args_and_config(args=[])
    assert from_yaml[0] == default[0]
    for name in ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "lr_scheduler_type",
                 "train_sampling_strategy", "seed", "output_dir", "bf16"):
        assert getattr(from_yaml[1], name) == getattr(default[1], name), name
    # the default world has the noisy teacher's decisions more often than the world's own default
    assert default[0].world_config() == sft.WorldConfig(p_inverse=0.5)
    assert default[0].teacher_noise == "inverse=0.7,stale=0.7"
    clean = parser.parse_args_and_config(args=["--config", str(recipe.with_name("clean_world.yaml"))])[0]
    assert clean.world_config() == sft.WorldConfig() and clean.teacher_noise == "none"


def test_verifier_lm_recipe_is_a_larger_model_of_the_same_world():
    from pathlib import Path

    from trl import TrlParser

    root = Path(__file__).resolve().parents[1] / "configs" / "sft"
    parser = TrlParser((sft.WorldSFTArguments, sft.WorldSFTConfig))
    tiny, _ = parser.parse_args_and_config(args=["--config", str(root / "tiny_world.yaml")])
    big, big_training = parser.parse_args_and_config(args=["--config", str(root / "verifier_lm.yaml")])
    assert big.world_config() == tiny.world_config() and big.world_seed == tiny.world_seed
    assert big.tasks == tiny.tasks and big.n_train == tiny.n_train
    assert big.hidden_size * big.num_layers > tiny.hidden_size * tiny.num_layers
    assert big_training.output_dir == "outputs/sft_big"
    assert big.teacher_noise == "none"  # a verifier taught the policy's misreadings could not flag them


def test_bench_sft_order_counts_the_padding_of_each_batch_order():
    """`scripts/bench_sft_order.py`'s share of tokens that are not padding, against hand-computed
    values: one batch of all rows pads every row to the longest (20 of 32 tokens real) whatever the
    order; equal rows pad nothing; the ragged last batch is dropped as the recipe drops it (the long
    row is either dropped, 24 of 24, or pads its batch of four, 30 of 48)."""
    from scripts.bench_sft_order import useful_share

    for order in ("random", "group_by_length"):
        assert useful_share([2, 4, 6, 8], 4, order) == pytest.approx(20 / 32)
        assert useful_share([5] * 12, 4, order) == 1.0
        assert useful_share([3] * 8 + [9], 4, order, seed=1) in (1.0, pytest.approx(30 / 48))
    # Sixteen rows, batches of 2: length grouping sorts mega-batches of 4 rows, so a batch mixes a
    # long and a short row only where a mega-batch holds an odd number of long ones.
    rows = [1] * 8 + [3] * 8
    for seed in range(5):
        assert useful_share(rows, 2, "group_by_length", seed) >= useful_share(rows, 2, "random", seed)
    assert useful_share(rows, 2, "group_by_length", 0) > 0.8
