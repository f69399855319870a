"""A saved model folder checked before anything loads it: one line naming the file and what to do.

`check_model_path(flag, path)` is what every command that takes a model (`--policy`, a verifier
spec's PATH, `serve --model`) runs first: a folder must hold a config, whole safetensors weights
(a truncated copy is named, not a 55-line `SafetensorError`) and the tokenizer's files (every loader
here reads the tokenizer from the model's own folder, a LoRA adapter's too); a path that is not a
folder must be one that can only be a Hub id (`looks_local`), so that a typo or a model not built yet
is named instead of reported as a Hub connection error after loading has begun.

No weight is read: a safetensors file's header says how long the file must be.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model", "qwen.tiktoken")
"""Files one of which a tokenizer saved with `save_pretrained` has (fast, sentencepiece, BPE, WordPiece,
tiktoken); without any, transformers asks to install sentencepiece or tiktoken and names no path."""

_MAX_HEADER_BYTES = 100 * 1024 * 1024
"""safetensors' own bound on the JSON header."""


class ModelFilesError(ValueError):
    """A model path or folder that cannot be loaded, said in one line."""


_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""One part of a Hub repository id (huggingface_hub's rule: letters, digits, `.`, `_`, `-`, not starting
with `.`/`-`, at most 96 characters, no `--` or `..`)."""

LOCAL_ROOTS = ("outputs",)
"""First path components that name this toolkit's own folders, never a Hub owner: `outputs/NAME` is a
model a run writes (or builds), so its absence is a missing folder, not a Hub id to download."""


def looks_local(path: str) -> bool:
    """Whether `path` can only mean a folder on this machine, so that its absence is an error to say
    at once rather than a Hub id to try: it starts with `/`, `.` or `~`; or has more than one `/`; or
    is not of the Hub id form `name` / `owner/name`; or its first component exists here or is one of
    `LOCAL_ROOTS`. What is left (`gpt2`, `Qwen/Qwen2.5-Math-PRM-7B`, absent here) goes to the Hub
    loader. The one rule every model path of every command line is judged by."""
    if not path or path.startswith(("/", ".", "~")) or path.count("/") > 1:
        return True
    parts = path.split("/")
    if any(not _HUB_NAME.fullmatch(part) or "--" in part or ".." in part for part in parts):
        return True
    return len(parts) == 2 and (parts[0] in LOCAL_ROOTS or Path(parts[0]).exists())


def check_model_path(flag: str, path: str, *, tokenizer: bool = True) -> None:
    """ModelFilesError unless `path` is a loadable saved model's folder (see `check_model_folder`) or
    can only be a Hub id (not `looks_local`), so that a typo fails before anything loads."""
    p = Path(path)
    if p.is_dir():
        check_model_folder(flag, p, tokenizer=tokenizer)
        return
    if p.exists() or looks_local(path):
        raise ModelFilesError(f"{flag} {path}: no such model directory")


def check_model_folder(flag: str, folder: str | Path, *, tokenizer: bool = True) -> None:
    """ModelFilesError naming the file when `folder` lacks config.json (or a LoRA adapter's
    adapter_config.json), a safetensors file is truncated or unreadable, a shard its index names
    is missing, or (`tokenizer`) no tokenizer file is there."""
    folder = Path(folder)
    adapter = (folder / "adapter_config.json").exists()
    if not ((folder / "config.json").exists() or adapter):
        raise ModelFilesError(f"{flag} {folder}: no config.json or adapter_config.json (not a saved model)")
    for index in sorted(folder.glob("*.safetensors.index.json")):
        for shard in sorted(set(_index_shards(flag, index))):
            if not (folder / shard).is_file():
                raise ModelFilesError(f"{flag} {folder}: {shard}, a shard that {index.name} names, is missing; "
                                      "copy the whole folder again")
    for weights in sorted(folder.glob("*.safetensors")):
        _check_safetensors(flag, weights)
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFilesError(f"{flag} {folder}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...); "
                              "save the tokenizer there too (tokenizer.save_pretrained)")


def _index_shards(flag: str, index: Path) -> list[str]:
    try:
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        return [str(v) for v in weight_map.values()]
    except (OSError, ValueError, AttributeError, RecursionError):
        raise ModelFilesError(f"{flag} {index}: not a safetensors index (unreadable JSON); copy the folder "
                              "again") from None


def _check_safetensors(flag: str, path: Path) -> None:
    """A safetensors file is 8 bytes of header length, a JSON header whose tensors' `data_offsets`
    give the data's length, then the data: a shorter file was cut off."""
    size = path.stat().st_size
    again = "copy or save the model again"
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            raw = fh.read(n) if n is not None and n <= _MAX_HEADER_BYTES and 8 + n <= size else None
    except OSError as err:
        raise ModelFilesError(f"{flag} {path}: cannot be read ({err.strerror or err}); check its permissions") from None
    if n is None:
        raise ModelFilesError(f"{flag} {path}: truncated ({size} bytes, not even a header); {again}")
    if n > _MAX_HEADER_BYTES:
        raise ModelFilesError(f"{flag} {path}: not a safetensors file (header of {n} bytes); {again}")
    if raw is None:
        raise ModelFilesError(f"{flag} {path}: truncated ({size} bytes, its header alone needs {8 + n}); {again}")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise ModelFilesError(f"{flag} {path}: not a safetensors file (its header is not JSON); {again}") from None
    if not isinstance(header, dict):
        raise ModelFilesError(f"{flag} {path}: not a safetensors file (its header is not a JSON object); {again}")
    ends = [t.get("data_offsets", [0, 0])[1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    need = 8 + n + max([e for e in ends if isinstance(e, int)], default=0)
    if size < need:
        raise ModelFilesError(f"{flag} {path}: truncated ({size} of {need} bytes); {again}")


def head_dim_of(folder: str | Path) -> int | None:
    """The attention head dimension a saved model's config.json gives (`head_dim`, else hidden size
    over heads); None where it has no readable config or says neither."""
    import json

    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
