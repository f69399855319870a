"""Known-noise lines of a PPO launch, silenced before the libraries that print them are imported.

`rl/ppo_step.py` imports this module first. Each filter drops exactly one known line and nothing
else (no blanket warning filter, no log level lowered), so a real warning of the same library still
shows:

- DeepSpeed, where it is installed, says on every start on a machine without a GPU that it set its
  accelerator to the CPU (`Setting accelerator to CPU. If you have GPU ...` from its auto-detection,
  `Setting ds_accelerator to cpu (...)` from older releases and `DS_ACCELERATOR=cpu`), on stdout, from
  its `DeepSpeed` logger. Its line for a GPU is kept.
- accelerate, saving a checkpoint of a model whose output layer is tied to its input embeddings (the
  tiny policies, and most small pretrained ones), says `Removed shared tensor {'...lm_head.weight'}
  while saving. This should be OK, but check by verifying ...`: the tie is the model's own and
  `from_pretrained` restores it. A shared tensor other than `lm_head.weight` is still reported.
"""

from __future__ import annotations

import logging
import re

NOISE: dict[str, re.Pattern[str]] = {
    "DeepSpeed": re.compile(r"^(Setting accelerator to CPU\. If you have GPU or other accelerator, we were unable "
                            r"to detect it\.|Setting ds_accelerator to cpu \()"),
    "accelerate.utils.other": re.compile(r"^(\[RANK \d+\] )?Removed shared tensor \{'([\w.]*\.)?lm_head\.weight'"
                                         r"(, '([\w.]*\.)?lm_head\.weight')*\} while saving\."),
}
"""Logger name -> the one kind of line dropped from it (matched on the formatted message)."""


class DropLine(logging.Filter):
    """Drops a logger's records whose message matches `pattern`; keeps every other record."""

    def __init__(self, pattern: re.Pattern[str]):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def install() -> None:
    """Add each `NOISE` filter to its logger, once. A logger made later by the library under the same
    name (`logging.getLogger`) is this object, and keeps the filter."""
    for name, pattern in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropLine) and f.pattern is pattern for f in logger.filters):
            logger.addFilter(DropLine(pattern))


install()
