#!/usr/bin/env bash
# PPO with the answer check on a real pretrained model, several seeds side by side on one GPU, each
# stopped by a time limit (--max_train_seconds) and then evaluated greedily before/after. A lab tool
# for docs/results/real_model.md: one launch per seed, each its own process on the same device.
#
#   bash experiments/real_ppo_seeds.sh MODEL TRAIN.jsonl EVAL.jsonl OUT_DIR [SECONDS] [SEEDS] [LR]
#
# SECONDS: each run's training time limit (default 300); SEEDS: a comma list (default 0,1,2); LR:
# the policy's learning rate (default 5e-6); EXTRA (environment): more rl/ppo_step.py flags, which
# override these (a quick check: EXTRA="--num_generations 2 --max_completion_length 16"). Prints one
# line per seed from its eval.json.
set -u
MODEL=$1 TRAIN=$2 EVAL=$3 OUT_DIR=$4 SECONDS_LIMIT=${5:-300} SEEDS=${6:-0,1,2} LR=${7:-5e-6}
PY=${PYTHON:-python}
mkdir -p "$OUT_DIR"
n_eval=$(wc -l < "$EVAL") n_train=$(wc -l < "$TRAIN")
bf16=false
"$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && bf16=true
for s in ${SEEDS//,/ }; do
  acc=(--num_processes 1 --num_machines 1 --dynamo_backend no)
  [ $bf16 = true ] && acc+=(--mixed_precision bf16) || acc+=(--mixed_precision no --cpu)
  "$PY" -m accelerate.commands.launch "${acc[@]}" rl/ppo_step.py \
    --model_name_or_path "$MODEL" --reward gold --answer_match flexible \
    --dataset "$TRAIN" --n_prompts "$n_train" --eval_dataset "$EVAL" --n_eval "$n_eval" --n_probe 0 \
    --build_missing false --max_steps 1000 --max_train_seconds "$SECONDS_LIMIT" \
    --prompts_per_update 8 --num_generations 8 --max_completion_length 256 --learning_rate "$LR" \
    --save_steps 0 --seed "$s" --bf16 $bf16 --report_to none --disable_tqdm true \
    --output_dir "$OUT_DIR/seed$s" ${EXTRA:-} > "$OUT_DIR/seed$s.log" 2>&1 &
done
wait
for s in ${SEEDS//,/ }; do
  if [ -f "$OUT_DIR/seed$s/eval.json" ]; then
    "$PY" - "$OUT_DIR/seed$s" "$s" <<'EOF'
import json, sys
run, seed = sys.argv[1], sys.argv[2]
e = json.load(open(f"{run}/eval.json"))
m = [json.loads(x) for x in open(f"{run}/metrics.jsonl") if '"time/update"' in x]
per = sum(r["time/update"] for r in m[1:]) / max(1, len(m) - 1)
acc = [r.get("rollout/accuracy", 0.0) for r in m]
print(f"seed {seed}: {e['updates']} updates, greedy {e['greedy_accuracy_before']:.3f} -> "
      f"{e['greedy_accuracy_after']:.3f} ({e['improvement']:+.3f} [{e['improvement_ci_low']:+.3f}, "
      f"{e['improvement_ci_high']:+.3f}]) on {e['n']}; {per:.1f} s/update after the first; "
      f"peak {max(r.get('memory/peak_gib', 0) for r in m):.2f} GiB; sampled accuracy first 5 "
      f"{sum(acc[:5]) / max(1, len(acc[:5])):.3f}, last 5 {sum(acc[-5:]) / max(1, len(acc[-5:])):.3f}")
EOF
  else
    echo "seed $s: no eval.json; the log's last lines:"; tail -5 "$OUT_DIR/seed$s.log"
  fi
done
