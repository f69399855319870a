"""Torch thread counts: one per process when processes share the machine, every core when alone.

torch reads OMP_NUM_THREADS once, at import, so each command-line main calls
`one_thread_unless_told()` first: one thread unless the environment asks for more (two torch
processes with two threads each on two cores run many times slower than with one). A caller that
runs a main in its own process while nothing else runs (the PPO script building its SFT policy,
compare's SFT and PSV stages) wraps the call in `torch_threads(n)`, so the main keeps n threads.
torch is imported only when these are called.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def available_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def one_thread_unless_told() -> None:
    """One torch thread in this process unless OMP_NUM_THREADS already says how many."""
    if os.environ.setdefault("OMP_NUM_THREADS", "1") == "1":
        import torch

        torch.set_num_threads(1)


def threads_for_baseline(num_threads: int) -> None:
    """A baseline run's torch threads (rl.baselines.grpo_peer, rl.baselines.rft): `--num_threads N` sets N, as for a PPO
    run beside it; 0 keeps one thread unless OMP_NUM_THREADS says how many."""
    one_thread_unless_told()
    if num_threads > 0:
        import torch

        torch.set_num_threads(num_threads)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """`n` torch threads inside the block (OMP_NUM_THREADS too, for mains called there); restored after."""
    import torch

    before_env, before = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
        if before_env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before_env
