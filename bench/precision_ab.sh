#!/usr/bin/env bash
# The precision A/B of examples/precision-ab on one GPU: the same 300-step LoRA run in bf16, FP8
# and emulated FP4, then `tuneforge compare`. Usage: bash bench/precision_ab.sh OUT_DIR [STEPS]
set -euo pipefail
out=${1:?an output directory}
steps=${2:-300}
python examples/precision-ab/make_data.py
for precision in bf16 fp8 fp4; do
  python -m tuneforge train examples/precision-ab/$precision.yaml run.output_dir="$out/runs/ab-$precision" \
    train.max_steps="$steps" train.time_limit=210s logging.progress=false logging.tensorboard=false --overwrite > "$out/$precision.log" 2>&1 \
    || { echo "$precision failed:"; tail -20 "$out/$precision.log"; }
  grep -h "precision:\|tokens/s\|held-out" "$out/$precision.log" | tail -6
done
python -m tuneforge compare "$out"/runs/ab-{bf16,fp8,fp4} --out "$out/precision-ab.png" --json > "$out/compare.json"
COLUMNS=120 python -m tuneforge compare "$out"/runs/ab-{bf16,fp8,fp4}
