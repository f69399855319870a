"""Verifiers: process annotation, PSV model and training, scoring, step-level evaluation."""
