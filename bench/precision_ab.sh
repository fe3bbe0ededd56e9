#!/usr/bin/env bash
# The precision A/B of examples/precision-ab on one GPU: the same LoRA run in bf16, FP8 and
# emulated FP4, then `tuneforge compare`. Run directories go to RUNS (default /tmp/precision-ab);
# their logs, metrics and configurations to OUT_DIR.
#   [PRECISIONS="bf16 bf16-seed1 fp8 fp4"] [LIMIT=210s] bash bench/precision_ab.sh OUT_DIR [STEPS [RUNS]]
set -euo pipefail
out=${1:?an output directory}
steps=${2:-300}
runs=${3:-/tmp/precision-ab}
python examples/precision-ab/make_data.py
for precision in ${PRECISIONS:-bf16 bf16-seed1 fp8 fp4}; do
  run="$runs/ab-$precision"
  python -m tuneforge train examples/precision-ab/$precision.yaml run.output_dir="$run" \
    train.max_steps="$steps" train.time_limit=${LIMIT:-210s} logging.progress=false \
    logging.tensorboard=false --overwrite > "$out/$precision.log" 2>&1 \
    || { echo "$precision failed:"; tail -20 "$out/$precision.log"; }
  grep -h "precision:\|tokens/s\|held-out" "$out/$precision.log" | tail -6 || true
  mkdir -p "$out/ab-$precision"
  cp "$run/metrics.jsonl" "$run/config.yaml" "$out/ab-$precision/" || true
done
COLUMNS=120 python -m tuneforge compare "$out"/ab-bf16 $(ls -d "$out"/ab-* | grep -v '/ab-bf16$') || true
