#!/usr/bin/env bash
# PPO with the answer check on a real pretrained model, several seeds side by side on one GPU, each
# stopped by a time limit (--max_train_seconds) and then evaluated greedily before/after. A lab tool
# for docs/results/real_model.md: one launch per seed, each its own process on the same device.
#
#   bash experiments/real_ppo_seeds.sh MODEL TRAIN.jsonl EVAL.jsonl OUT_DIR [SECONDS] [SEEDS] [LR]
#
# SECONDS: each run's training time limit (default 300); SEEDS: a comma list (default 0,1,2); LR:
# the policy's learning rate (default 5e-6); EXTRA (environment): more rl/ppo_step.py flags, which
# override these (a quick check: EXTRA="--num_generations 2 --max_completion_length 16"). Runs go to
# OUT_DIR/ppo_sSEED; scripts/rl_comparison.py then writes OUT_DIR/comparison.{md,json,png} and prints it.
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
    --output_dir "$OUT_DIR/ppo_s$s" ${EXTRA:-} > "$OUT_DIR/ppo_s$s.log" 2>&1 &
done
wait
runs=(); for s in ${SEEDS//,/ }; do
  if [ -f "$OUT_DIR/ppo_s$s/eval.json" ]; then runs+=("$OUT_DIR/ppo_s$s")
  else echo "seed $s: no eval.json; the log's last lines:"; tail -5 "$OUT_DIR/ppo_s$s.log"; fi
done
# per seed and pooled over the seeds: greedy before and after with paired intervals, seconds per update
[ ${#runs[@]} -gt 0 ] && "$PY" scripts/rl_comparison.py "${runs[@]}" --out "$OUT_DIR/comparison"
