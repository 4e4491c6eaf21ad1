# The int8 training quality check (docs/speed.md, run AE): the shipped Fashion-MNIST recipe, 700 steps, bf16 with
# and without train.int8, seeds 0-2, compiled; run from the repository root. Each run's metrics.jsonl, report.json
# and recipe.yaml are kept beside this file.
set -x
for seed in 0 1 2; do
for i8 in false true; do
  .venv/bin/vitlab train src/vitlab/configs/fmnist_scratch.yaml -o /tmp/runs/fm_s${seed}_int8_${i8} --no-progress --set train.epochs=null train.steps=700 train.time_budget_min=null train.precision=bf16 train.compile=true train.int8=$i8 train.seed=$seed train.log_every=100
done; done
