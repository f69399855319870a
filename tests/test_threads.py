"""Torch thread counts for mains run alone or side by side."""

import os

import torch

from reasoning.threads import available_cores, one_thread_unless_told, torch_threads


def test_torch_threads_sets_and_restores_env_and_torch(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with torch_threads(2) as n:
        assert n == 2 and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        one_thread_unless_told()  # what a main called inside does: keeps the block's count
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("OMP_NUM_THREADS")
    with torch_threads(2):
        pass
    assert "OMP_NUM_THREADS" not in os.environ and available_cores() >= 1
    one_thread_unless_told()
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
