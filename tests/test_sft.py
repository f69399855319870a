"""The SFT script end to end on a tiny budget: trains, saves, reloads, evaluates."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backends.base import SamplingParams, cut_at_stop
from backends.hf import HFGenerator
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
    from reasoning.world import taught_tasks  # StepCo's revision=auto reads what the policy was taught

    assert json.loads((out / "teacher.json").read_text())["tasks"] == ["explore", "solve"] == taught_tasks(out)
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


def test_sparse_recipe_is_the_long_recipe_wider_slower_and_twice_over():
    """configs/sft/sparse_world.yaml is the draw measured in docs/results/sparse_world.md: the long
    recipe with hidden 256, learning rate 5e-4 and two epochs, nothing else changed."""
    import dataclasses
    from pathlib import Path

    from trl import TrlParser

    root = Path(__file__).resolve().parents[1] / "configs" / "sft"
    parser = TrlParser((sft.WorldSFTArguments, sft.WorldSFTConfig))
    long, long_training = parser.parse_args_and_config(args=["--config", str(root / "long_world.yaml")])
    sparse, sparse_training = parser.parse_args_and_config(args=["--config", str(root / "sparse_world.yaml")])
    changed = {k: v for k, v in vars(sparse).items() if vars(long)[k] != v}
    assert changed == {"hidden_size": 256}
    settings = [f.name for f in dataclasses.fields(sparse_training) if f.init]  # not the run's state objects
    training = {k for k in settings if getattr(sparse_training, k) != getattr(long_training, k)}
    assert training <= {"output_dir", "logging_dir", "learning_rate", "num_train_epochs", "run_name"}, training
    assert (sparse_training.learning_rate, sparse_training.num_train_epochs) == (5e-4, 2)
    assert sparse_training.output_dir == "outputs/sft_sparse" and sparse_training.seed == long_training.seed == 0


def test_length_bucket_indices_batches_rows_of_similar_length_in_random_order():
    """Every row once; with one chunk covering all rows each batch holds one length; the batches'
    order changes with the seed (not a sweep from short to long); a ragged batch goes last."""
    lengths = [1] * 8 + [2] * 8 + [3] * 8 + [4] * 8
    orders = set()
    for seed in range(6):
        idx = sft.length_bucket_indices(lengths, 4, torch.Generator().manual_seed(seed))
        assert sorted(idx) == list(range(32))
        batches = [[lengths[i] for i in idx[s:s + 4]] for s in range(0, 32, 4)]
        assert all(len(set(b)) == 1 for b in batches)
        orders.add(tuple(b[0] for b in batches))
    assert len(orders) > 1
    # Chunks of 2 batches (8 rows): each chunk is sorted on its own, so batches mix at most 2 lengths.
    idx = sft.length_bucket_indices(lengths, 4, torch.Generator().manual_seed(0), mega_batches=2)
    assert sorted(idx) == list(range(32))
    # 10 rows, batches of 4: the 2 rows of the ragged batch come last, where drop_last drops them.
    idx = sft.length_bucket_indices(list(range(10)), 4, torch.Generator().manual_seed(3))
    assert sorted(idx[:8]) == list(range(8)) and idx[8:] == [8, 9]  # the last chunk's longest rows


def test_length_buckets_reach_the_trainer_dataloader(tmp_path):
    """`--length_buckets true` replaces the trainer's sampler: with rows of two lengths every batch
    the dataloader makes is free of padding, while random batches of the same rows pad some."""
    from datasets import Dataset

    from reasoning.tokenizer import train_tokenizer
    from rl.models import build_tiny_causal_lm

    rows = [{"prompt": "Question: a b", "completion": " c"}] * 8
    rows += [{"prompt": "Question: a b a b a b a b a b a b", "completion": " c a b c a b c"}] * 8
    tokenizer = train_tokenizer((r["prompt"] + r["completion"] for r in rows), vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, "llama", 32, 1, 2, seed=0)
    padded = {}
    for buckets in (True, False):
        args = sft.WorldSFTConfig(output_dir=str(tmp_path), length_buckets=buckets, per_device_train_batch_size=4,
                                  seed=1, report_to="none", disable_tqdm=True)
        trainer = sft.sft_trainer_class()(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                          processing_class=tokenizer)
        if buckets:
            assert isinstance(trainer._get_train_sampler(), sft.LengthBucketSampler)
        padded[buckets] = sum(int((b["attention_mask"] == 0).sum()) for _ in range(3)
                              for b in trainer.get_train_dataloader())
    assert padded[True] == 0 and padded[False] > 0


def test_bench_sft_order_counts_the_padding_of_each_batch_order():
    """`experiments/bench_sft_order.py`'s share of tokens that are not padding, against hand-computed
    values: one batch of all rows pads every row to the longest (20 of 32 tokens real) whatever the
    order; equal rows pad nothing; the ragged last batch is dropped as the recipe drops it (the long
    row is either dropped, 24 of 24, or pads its batch of four, 30 of 48)."""
    from experiments.bench_sft_order import useful_share

    for order in ("random", "group_by_length", "length_buckets"):
        assert useful_share([2, 4, 6, 8], 4, order) == pytest.approx(20 / 32)
        assert useful_share([5] * 12, 4, order) == 1.0
        assert useful_share([3] * 8 + [9], 4, order, seed=1) in (1.0, pytest.approx(30 / 48))
    # Sixteen rows, batches of 2: length grouping sorts mega-batches of 4 rows, so a batch mixes a
    # long and a short row only where a mega-batch holds an odd number of long ones.
    rows = [1] * 8 + [3] * 8
    for seed in range(5):
        assert useful_share(rows, 2, "group_by_length", seed) >= useful_share(rows, 2, "random", seed)
    assert useful_share(rows, 2, "group_by_length", 0) > 0.8
    # Length buckets sort chunks of 50 batches (all 16 rows here): no batch mixes the two lengths.
    assert useful_share(rows, 2, "length_buckets", 0) == 1.0
    # batch_rebalance pads each of a step's 4 micro-batches on its own: 4 rows a step, one per
    # micro-batch, pad nothing; 8 rows of two lengths put every length in its own micro-batches.
    assert useful_share([2, 4, 6, 8], 4, "batch_rebalance") == 1.0
    assert useful_share([1, 1, 3, 3, 1, 1, 3, 3], 8, "batch_rebalance") == 1.0
    with pytest.raises(ValueError, match="unknown order"):
        useful_share([1, 2], 2, "shortest_first")


def test_batches_are_pinned_only_where_a_gpu_takes_them():
    """Pinned memory serves the copy to a GPU; without one torch warns at every SFT run and ignores it
    (seen with both the CPU build and PyPI's CUDA build on a CPU machine). The default follows
    torch.cuda.is_available(), read when the config is made."""
    from trl import TrlParser

    parser = TrlParser((sft.WorldSFTArguments, sft.WorldSFTConfig))
    assert not torch.cuda.is_available()
    _, config = parser.parse_args_and_config(args=["--output_dir", "x"])
    assert config.dataloader_pin_memory is False and not config.use_cpu
    _, config = parser.parse_args_and_config(args=["--output_dir", "x", "--dataloader_pin_memory", "true"])
    assert config.dataloader_pin_memory is True
