"""SFT warm-up of a policy on the world corpus with TRL's `SFTTrainer`.

    python -m rl.sft [--config configs/sft/tiny_world.yaml] --output_dir D

With no `model_name_or_path` it trains a byte-level BPE tokenizer on the corpus and a tiny
Llama/Qwen2 model from config; with one it fine-tunes that model. It saves the policy with
`save_pretrained` and writes `D/eval.json` (greedy accuracy on the world test split, the error mix
of wrong answers, timings) and `D/eval_rows.jsonl` (one row per test problem).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from trl import SFTConfig

from backends.hf import HFGenerator
from backends.model_files import check_model_path
from reasoning.corpora import TASKS, build_corpus, parse_teacher_noise
from reasoning.flag_names import did_you_mean
from reasoning.threads import one_thread_unless_told
from reasoning.tokenizer import train_tokenizer
from reasoning.world import WorldConfig, generate, row_to_problem
from rl.greedy_accuracy import greedy_eval
from rl.models import build_tiny_causal_lm

WORLD_FIELDS = ("min_steps", "max_steps", "max_base", "max_delta", "max_factor", "max_value", "p_inverse",
                "min_distractors", "max_distractors", "p_together", "n_names", "n_items")


@dataclass
class WorldSFTArguments:
    """What to train on and which model to start from."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A Hub id or local path; None builds a tiny model from config."}
    )
    arch: str = field(default="llama", metadata={"help": "Tiny model architecture: llama or qwen2."})
    hidden_size: int = field(default=128, metadata={"help": "Tiny model width."})
    num_layers: int = field(default=4, metadata={"help": "Tiny model depth."})
    num_heads: int = field(default=4, metadata={"help": "Tiny model attention heads."})
    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size of the tiny tokenizer."})
    n_train: int = field(default=40000, metadata={"help": "World training problems."})
    n_eval: int = field(default=500, metadata={"help": "World test problems for the greedy accuracy."})
    world_seed: int = field(default=0, metadata={"help": "Seed of the world's train and test problems."})
    tasks: str = field(
        default="solve=1.0,explore=0.1",
        metadata={"help": f"Corpus mixture, task=weight per problem; tasks: {', '.join(TASKS)}."},
    )
    teacher_noise: str = field(
        default="inverse=0.7,stale=0.7",
        metadata={"help": "The teacher's misreadings, kind=rate per decision kind (inverse: an inversely phrased "
                          "relation computed with the operation its words name; stale: a count before an event "
                          "used after it): `solve` demonstrations take that wrong reading at that rate and carry "
                          "it to a wrong answer. 'none': the clean teacher, where capacity, not choice, limits "
                          "the policy."},
    )
    eval_batch_size: int = field(default=100, metadata={"help": "Batch size of greedy evaluation."})
    max_new_tokens: int = field(default=160, metadata={"help": "Generation limit in evaluation."})
    world_min_steps: int = field(default=WorldConfig.min_steps, metadata={"help": "World: fewest steps."})
    world_max_steps: int = field(default=WorldConfig.max_steps, metadata={"help": "World: most steps."})
    world_max_base: int = field(default=WorldConfig.max_base, metadata={"help": "World: largest given count."})
    world_max_delta: int = field(default=WorldConfig.max_delta, metadata={"help": "World: largest +/- constant."})
    world_max_factor: int = field(default=WorldConfig.max_factor, metadata={"help": "World: largest factor."})
    world_max_value: int = field(default=WorldConfig.max_value, metadata={"help": "World: largest quantity."})
    world_p_inverse: float = field(
        default=0.5, metadata={"help": "World: inverse phrasing (0.5: more of the decisions the noisy teacher "
                                       "misreads; the world's own default is 0.25)."})
    world_min_distractors: int = field(default=WorldConfig.min_distractors, metadata={"help": "World."})
    world_max_distractors: int = field(default=WorldConfig.max_distractors, metadata={"help": "World."})
    world_p_together: float = field(default=WorldConfig.p_together, metadata={"help": "World."})
    world_n_names: int = field(default=WorldConfig.n_names, metadata={"help": "World: size of the name pool."})
    world_n_items: int = field(default=WorldConfig.n_items, metadata={"help": "World: size of the item pool."})

    def world_config(self) -> WorldConfig:
        return WorldConfig(**{name: getattr(self, f"world_{name}") for name in WORLD_FIELDS})

    def task_weights(self) -> dict[str, float]:
        weights = {}
        for part in filter(None, (p.strip() for p in self.tasks.split(","))):
            name, sep, value = part.partition("=")
            if not sep or name not in TASKS:
                raise ValueError(f"--tasks: expected task=weight with task in {TASKS}, got {part!r}")
            weights[name] = float(value)
        return weights


@dataclass
class WorldSFTConfig(SFTConfig):
    """TRL's SFTConfig with the embedded CPU default: a tiny model trained from scratch."""

    output_dir: str | None = field(default="outputs/sft_tiny", metadata={"help": "Where the policy goes."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Passes over the corpus."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Batch size per process."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(default=0.03, metadata={"help": "Warm-up (fraction of steps when < 1)."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    logging_steps: float = field(default=50, metadata={"help": "Log every N steps."})
    save_strategy: str = field(default="no", metadata={"help": "Checkpointing during SFT."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Off: tiny models do not need it."})
    bf16: bool | None = field(default=False, metadata={"help": "bf16 mixed precision (GPU recipes)."})
    max_length: int | None = field(default=512, metadata={"help": "Longest tokenized example."})
    seed: int = field(default=0, metadata={"help": "Training seed."})
    dataloader_drop_last: bool = field(default=True, metadata={"help": "Drop the ragged last batch."})
    dataloader_pin_memory: bool = field(
        default_factory=lambda: torch.cuda.is_available(),
        metadata={"help": "Page-locked batches for the copy to a GPU; off where there is none (torch warns and "
                          "ignores it there)."},
    )
    train_sampling_strategy: str = field(
        default="random", metadata={"help": "random, sequential, group_by_length or batch_rebalance."}
    )
    length_buckets: bool = field(
        default=False,
        metadata={"help": "Batches of rows of similar length, the batches in random order: less padding than "
                          "random batches, without group_by_length's sweep from the longest rows to the shortest "
                          "in each mega-batch. Overrides train_sampling_strategy."},
    )


def length_bucket_indices(lengths: list[int], batch_size: int, generator, mega_batches: int = 50) -> list[int]:
    """Row order for `length_buckets`: each run of `batch_size` rows is of similar length.

    The rows are shuffled and cut into chunks of `mega_batches` batches; each chunk is sorted by
    length and cut into batches; then the batches of all chunks are put in a random order. Only the
    last chunk can end in a ragged batch, and it goes last, where `dataloader_drop_last` drops it.
    """
    import torch

    perm = torch.randperm(len(lengths), generator=generator).tolist()
    chunk = batch_size * mega_batches
    batches = []
    for start in range(0, len(perm), chunk):
        rows = sorted(perm[start:start + chunk], key=lambda i: lengths[i])
        batches.extend(rows[i:i + batch_size] for i in range(0, len(rows), batch_size))
    ragged = batches.pop() if batches and len(batches[-1]) < batch_size else []
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [i for b in order for i in batches[b]] + ragged


class LengthBucketSampler:
    """A torch sampler over `length_bucket_indices`, a new order each epoch."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed, self.epoch = list(lengths), batch_size, seed, 0

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        import torch

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        return iter(length_bucket_indices(self.lengths, self.batch_size, generator))


def sft_trainer_class():
    """TRL's SFTTrainer, with the `length_buckets` sampler when the config asks for it."""
    from trl import SFTTrainer

    class WorldSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            if not getattr(self.args, "length_buckets", False) or dataset is None:
                return super()._get_train_sampler(train_dataset)
            lengths = [len(ids) for ids in dataset["input_ids"]]
            return LengthBucketSampler(lengths, self.args.per_device_train_batch_size, self.args.seed)

    return WorldSFTTrainer


def _model_and_tokenizer(args: WorldSFTArguments, corpus: list[dict], seed: int):
    """A tiny model and a tokenizer trained on the corpus, or the model named by
    --model_name_or_path with its tokenizer (padding with EOS where it has no pad token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.model_name_or_path is None:
        tokenizer = train_tokenizer((r["prompt"] + r["completion"] for r in corpus), vocab_size=args.vocab_size)
        model = build_tiny_causal_lm(tokenizer, args.arch, args.hidden_size, args.num_layers, args.num_heads,
                                     seed=seed)
        return model, tokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(args.model_name_or_path), tokenizer


def _save_policy(out: Path, trainer, tokenizer, world, args: WorldSFTArguments, misread_rows: Counter) -> None:
    """The policy, its tokenizer, its world (`world_config.json`) and what it was taught
    (`teacher.json`: the noise, the tasks StepCo's revision=auto reads, the misread rows)."""
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "world_config.json").write_text(json.dumps(asdict(world), indent=2))
    task_weights = args.task_weights()
    (out / "teacher.json").write_text(json.dumps({"teacher_noise": parse_teacher_noise(args.teacher_noise),
                                                  "tasks": sorted(k for k, w in task_weights.items() if w > 0),
                                                  "corpus_misread_rows": dict(misread_rows)}, indent=2))


def run(args: WorldSFTArguments, training_args) -> dict:
    import torch
    from datasets import Dataset

    start = time.time()
    world = args.world_config()
    train_rows = generate("train", args.n_train, args.world_seed, world)
    test_rows = generate("test", args.n_eval, args.world_seed, world)
    corpus = build_corpus(train_rows, args.task_weights(), seed=training_args.seed, teacher_noise=args.teacher_noise)
    misread_rows = Counter(r["misread"] for r in corpus if r.get("misread"))
    model, tokenizer = _model_and_tokenizer(args, corpus, training_args.seed)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in corpus])
    trainer = sft_trainer_class()(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    train_seconds = time.time() - start
    out = Path(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        _save_policy(out, trainer, tokenizer, world, args, misread_rows)
    result: dict = {}
    if trainer.accelerator.is_main_process:
        model = trainer.model.eval()
        eval_start = time.time()
        with torch.no_grad():
            evaluation = greedy_eval(HFGenerator(model, tokenizer, batch_size=args.eval_batch_size),
                                     [row_to_problem(r) for r in test_rows], args.max_new_tokens)
        result = {
            "greedy_accuracy": evaluation["summary"]["accuracy"],
            **evaluation["summary"],
            "split": "test",
            "world_seed": args.world_seed,
            "seed": training_args.seed,
            "n_train_problems": len(train_rows),
            "corpus_rows": len(corpus),
            "corpus_tasks": args.task_weights(),
            "teacher_noise": parse_teacher_noise(args.teacher_noise),
            "corpus_misread_rows": dict(misread_rows),
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_seconds": round(train_seconds, 1),
            "eval_seconds": round(time.time() - eval_start, 1),
            "world_config": asdict(world),
        }
        (out / "eval.json").write_text(json.dumps(result, indent=2))
        with (out / "eval_rows.jsonl").open("w") as fh:
            for row in evaluation["rows"]:
                fh.write(json.dumps(row) + "\n")
        print(json.dumps({k: result[k] for k in ("greedy_accuracy", "n", "error_mix", "train_seconds",
                                                  "eval_seconds") if k in result}))
    return result


def flag_error(message: str, types) -> str:
    """A parser's error as one line, with the closest known flag to the first unknown one."""
    import re
    from dataclasses import fields

    message = " ".join(message.split(". Please remove them")[0].split())
    unknown = re.findall(r"'--([\w-]+)'", message) or re.findall(r"(?:arguments|argument): --([\w-]+)", message)
    names = [f.name for t in types for f in fields(t)]
    return message + (did_you_mean(unknown[0], names) if unknown else "")


def main(argv: list[str] | None = None) -> int:
    from trl import TrlParser

    one_thread_unless_told()  # torch read the thread count at import
    parser = TrlParser((WorldSFTArguments, WorldSFTConfig))

    def error(message: str):  # argparse would print the whole usage and exit
        raise ValueError(message)

    parser.error = error  # type: ignore[method-assign]
    try:
        args, training_args = parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError, OSError) as err:  # an unknown flag or recipe key, a bad value or recipe
        print(f"error: {flag_error(str(err), (WorldSFTArguments, WorldSFTConfig))}", file=sys.stderr)
        return 2
    try:
        args.world_config()
        args.task_weights()
        parse_teacher_noise(args.teacher_noise)
        if args.model_name_or_path is not None:  # a local-looking path must be there; a Hub id goes to the Hub
            check_model_path("--model_name_or_path", args.model_name_or_path)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run(args, training_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
