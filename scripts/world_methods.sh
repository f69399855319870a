#!/usr/bin/env bash
# Every inference method on the same 500 world test problems, one policy, one verifier, seed 0
# (the README figures). P, V and O override the policy, verifier and output folder.
cd "$(dirname "$0")/.."
P=${P:-outputs/sft_tasks}; V=${V:-outputs/psv_tiny}; O=${O:-runs/world}
E="${PYTHON:-.venv/bin/python} -m inference.evaluate --dataset world --policy $P --quiet"
$E --method greedy --out $O/greedy
$E --method self_consistency --n 10 --out $O/sc10
$E --method best_of_n --n 10 --verifier $V --out $O/bon10
$E --method stepco --max_rounds 5 --verifier $V --out $O/stepco_prompt
$E --method stepco --max_rounds 5 --revision resample --verifier $V --out $O/stepco_resample
$E --method pathco --max_rounds 5 --verifier $V --out $O/pathco
$E --method stepco --max_rounds 5 --verifier exact --out $O/stepco_exact_ref
$E --method stepco --max_rounds 5 --revision resample --verifier exact --out $O/stepco_resample_exact_ref
$E --method best_of_n --n 10 --verifier exact --out $O/bon10_exact_ref
$E --method beats --out $O/beats
