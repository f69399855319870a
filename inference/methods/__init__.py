"""Inference methods, one module each with the same call shape (see `base.py`)."""

METHODS = ("greedy", "self_consistency", "best_of_n", "stepco", "pathco", "beats")
