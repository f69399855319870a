"""The domain: problems, steps, reasoning paths, answer extraction and grading, benchmarks, the arithmetic world.

Imports nothing from the toolkit's other packages.
"""
