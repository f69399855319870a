"""Inference methods that share one verifier, and the evaluation harness. Never imports `rl`."""
