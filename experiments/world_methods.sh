#!/usr/bin/env bash
# Every inference method on the same 500 world test problems, one policy, one verifier, seed 0
# (docs/results/inference_clean_world.md). P, V and O override the policy, verifier and output folder.
# StepCo's θ and revision are given as these runs had them (their defaults are now chosen: auto).
#
# LINEUP=noisy runs the noisy-teacher world's lineup instead (docs/results/inference_noisy_world.md, "Figures on the noisy-teacher
# world" under Inference methods): policy outputs/sft_noisy, verifier outputs/psv_mc_a, only the
# methods a plain solve policy can run (resample revision; no prompt revision or BEATS, which need
# a policy trained on the revise/clarify/verify formats), plus step-confidence rows with θ = TC and
# rows with the step-likelihood of the clean-teacher model VL (θ = TL).
cd "$(dirname "$0")/.."
if [ "${LINEUP:-}" = noisy ]; then
  P=${P:-outputs/sft_noisy}; V=${V:-outputs/psv_mc_a}; O=${O:-runs/noisy}; TC=${TC:-0.11}
  VL=${VL:-step-likelihood:outputs/sft_clean_v}; TL=${TL:-0.817}
else
  P=${P:-outputs/sft_tasks}; V=${V:-outputs/psv_tiny}; O=${O:-runs/world}
fi
E="${PYTHON:-.venv/bin/python} -m inference.evaluate --dataset world --policy $P --quiet"
$E --method greedy --out $O/greedy
$E --method self_consistency --n 10 --out $O/sc10
$E --method best_of_n --n 10 --verifier $V --out $O/bon10
if [ "${LINEUP:-}" = noisy ]; then
  $E --method stepco --max_rounds 5 --revision resample --threshold 0.5 --verifier $V --out $O/stepco_resample
  $E --method pathco --max_rounds 5 --revision resample --verifier $V --out $O/pathco_resample
  $E --method best_of_n --n 10 --verifier exact --out $O/bon10_exact_ref
  $E --method stepco --max_rounds 5 --revision resample --threshold 0.5 --verifier exact --out $O/stepco_resample_exact_ref
  $E --method best_of_n --n 10 --verifier step-confidence:$P --out $O/bon10_stepconf
  $E --method stepco --max_rounds 5 --revision resample --threshold $TC --verifier step-confidence:$P \
    --out $O/stepco_resample_stepconf
  $E --method best_of_n --n 10 --verifier $VL --out $O/bon10_steplik
  $E --method stepco --max_rounds 5 --revision resample --threshold $TL --verifier $VL --out $O/stepco_resample_steplik
  exit 0
fi
$E --method stepco --max_rounds 5 --revision prompt --threshold 0.5 --verifier $V --out $O/stepco_prompt
$E --method stepco --max_rounds 5 --revision resample --threshold 0.5 --verifier $V --out $O/stepco_resample
$E --method pathco --max_rounds 5 --revision prompt --verifier $V --out $O/pathco
$E --method stepco --max_rounds 5 --revision prompt --threshold 0.5 --verifier exact --out $O/stepco_exact_ref
$E --method stepco --max_rounds 5 --revision resample --threshold 0.5 --verifier exact --out $O/stepco_resample_exact_ref
$E --method best_of_n --n 10 --verifier exact --out $O/bon10_exact_ref
$E --method beats --out $O/beats
