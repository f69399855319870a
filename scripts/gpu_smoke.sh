#!/usr/bin/env bash
# GPU checks with tiny models built here (no Hub access needed): bf16 PPO, 2-GPU DDP, DeepSpeed
# ZeRO-2 and ZeRO-3 for a few updates each, and the vLLM backend against hf under greedy decoding.
# Prints a pass/fail table; exits 0 with SKIP lines on machines without a GPU.
#   bash scripts/gpu_smoke.sh [WORKDIR]
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${1:-$(mktemp -d /tmp/gpu_smoke.XXXX)}
mkdir -p "$WORK"
NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
declare -a RESULTS
record() { RESULTS+=("$(printf '%-28s %s' "$1" "$2")"); }
if [ "$NGPU" = "0" ]; then
  echo "SKIP: no GPU (torch.cuda.is_available() is false); nothing to check here"
  exit 0
fi
echo "GPUs: $NGPU   work dir: $WORK"
export OMP_NUM_THREADS=4
# a tiny policy: tokenizer and ~1M-parameter Llama trained for a few steps on world text
if [ ! -f "$WORK/policy/config.json" ]; then
  $PY -m rl.sft --output_dir "$WORK/policy" --n_train 2000 --n_eval 20 --bf16 false > "$WORK/sft.log" 2>&1 \
    && record "tiny policy (sft)" PASS || { record "tiny policy (sft)" FAIL; }
fi
COMMON=(--policy "$WORK/policy" --verifier exact --build_missing false --num_updates 3 --prompts_per_update 16
        --samples_per_prompt 2 --n_prompts 200 --n_eval 50 --save_steps 2 --disable_tqdm true)
run_case() {  # name, accelerate args..., -- , ppo args...
  local name=$1; shift
  local acc=(); while [ "$1" != "--" ]; do acc+=("$1"); shift; done; shift
  if $PY -m accelerate.commands.launch "${acc[@]}" rl/ppo_step.py "${COMMON[@]}" --output_dir "$WORK/$name" "$@" \
      > "$WORK/$name.log" 2>&1 && [ -f "$WORK/$name/eval.json" ]; then
    record "$name" "PASS  $(tr -d '\n ' < "$WORK/$name/eval.json" | head -c 160)"
  else
    record "$name" "FAIL  (see $WORK/$name.log: $(tail -n 1 "$WORK/$name.log" | head -c 120))"
  fi
}
run_case bf16_1gpu --num_processes 1 --mixed_precision bf16 -- --bf16 true
if [ "$NGPU" -ge 2 ]; then
  run_case ddp_2gpu --config_file configs/accelerate/ddp.yaml --num_processes 2 -- --bf16 true
else
  record ddp_2gpu "SKIP (1 GPU)"
fi
if $PY -c "import deepspeed" 2>/dev/null; then
  NP=$(( NGPU >= 2 ? 2 : 1 ))
  run_case zero2 --config_file configs/accelerate/zero2.yaml --num_processes $NP -- --bf16 true
  run_case zero3 --config_file configs/accelerate/zero3.yaml --num_processes $NP -- --bf16 true
  run_case zero2_lora --config_file configs/accelerate/zero2.yaml --num_processes $NP -- --bf16 true --use_peft true
else
  record zero2 "SKIP (deepspeed not installed: pip install 'steprl[deepspeed]')"
  record zero3 "SKIP (deepspeed not installed)"
fi
if [ -f scripts/gpu_smoke_vllm.py ]; then
  if out=$($PY scripts/gpu_smoke_vllm.py --policy "$WORK/policy" 2>"$WORK/vllm.err"); then
    record vllm_vs_hf "$(echo "$out" | tail -n 1)"
  else
    record vllm_vs_hf "FAIL  $(echo "$out" | tail -n 1) $(tail -n 1 "$WORK/vllm.err" | head -c 120)"
  fi
fi
echo
printf '%-28s %s\n' check result
printf '%s\n' "${RESULTS[@]}"
