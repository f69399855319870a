"""Every inference method on a slice of every real benchmark: loading, prompting, extraction and
grading end to end (with tiny world models the accuracy means nothing; the point is that nothing
breaks and every anomaly is counted).

    python -m experiments.benchmark_slices --policy outputs/sft_tasks --verifier outputs/psv_tiny \
        [--limit 20] [--out runs/slices]

Runs `python -m inference.evaluate` (in-process) for each method × benchmark with small method
budgets, then prints a table: accuracy, problems, tokens and the flag counts of each cell, and
writes it to OUT/slices.md. A cell that fails is reported with its error, and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCHMARKS = ("gsm8k", "math500", "svamp", "addsub", "asdiv", "aqua", "gsm_ic_2step", "gsm_ic_mstep")
METHODS = {
    "greedy": [],
    "self_consistency": ["--n", "4"],
    "best_of_n": ["--n", "4"],
    "stepco": ["--max_rounds", "2", "--threshold", "0.5", "--revision", "prompt"],  # no dev split on a benchmark
    "pathco": ["--max_rounds", "2", "--revision", "prompt"],
    "beats": ["--branching", "2", "--width", "4", "--max_depth", "4", "--max_forward_steps", "2"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="outputs/sft_tasks")
    parser.add_argument("--verifier", default="outputs/psv_tiny")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/slices")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    parser.add_argument("--methods", default=",".join(METHODS))
    a = parser.parse_args()

    from inference import evaluate

    rows, failures = [], 0
    for bench in a.benchmarks.split(","):
        for method in a.methods.split(","):
            out = Path(a.out) / bench / method
            argv = ["--method", method, "--dataset", bench, "--policy", a.policy, "--verifier", a.verifier,
                    "--limit", str(a.limit), "--max_new_tokens", str(a.max_new_tokens), "--out", str(out),
                    "--quiet", *METHODS[method]]
            start = time.time()
            try:
                code = evaluate.main(argv)
                error = None if code == 0 else f"exit {code}"
            except Exception as err:  # noqa: BLE001 - a crash is what this script reports
                error = f"{type(err).__name__}: {err}"
            if error is not None:
                failures += 1
                rows.append((bench, method, None, error, time.time() - start))
                continue
            rows.append((bench, method, json.loads((out / "summary.json").read_text()), None, time.time() - start))
    lines = ["| benchmark | method | n | accuracy | generator tokens | verifier tokens | flags | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for bench, method, s, error, seconds in rows:
        if s is None:
            lines.append(f"| {bench} | {method} | — | FAILED: {error} | | | | {seconds:.0f} |")
            continue
        flags = ", ".join(f"{k} {v}" for k, v in sorted(s.get("flags", {}).items())) or "none"
        tokens = s["generator_prompt_tokens"] + s["generator_completion_tokens"]
        lines.append(f"| {bench} | {method} | {s['n']} | {s['accuracy']:.2f} | {tokens} | {s['verifier_tokens']} | "
                     f"{flags} | {seconds:.0f} |")
    table = "\n".join(lines)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "slices.md").write_text(table + "\n")
    print(table)
    print(f"{len(rows) - failures}/{len(rows)} cells ran; {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
