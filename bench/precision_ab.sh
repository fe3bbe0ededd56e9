#!/usr/bin/env bash
# The precision A/B of examples/precision-ab on one GPU: pretrain.yaml's model first (once; the
# A/B fine-tunes it), then the same LoRA run in bf16, FP8 and emulated FP4 for each seed, then
# `tuneforge compare` per seed (the pairs share data order and adapter initialisation) and over
# every run (each precision's runs grouped, against bf16's spread). Run directories go to RUNS (default
# /tmp/precision-ab); logs, metrics and configurations to OUT_DIR. JOBS runs that many at once
# (their tokens/s are then not comparable). FP4's emulation runs at about a quarter of bf16's
# speed: its runs get FP4_LIMIT where the others get LIMIT. ROUNDED="fp8 nvfp4" adds, per seed,
# the bf16 run on the model with its projections rounded through each format
# (`bench/rounded_base.py`): what rounding the base alone does, apart from rounding activations
# and gradients.
#   [PRECISIONS="bf16 fp8 fp4"] [SEEDS="0 1 2"] [ROUNDED=""] [JOBS=1] [LIMIT=210s] [FP4_LIMIT=600s] \
#     bash bench/precision_ab.sh OUT_DIR [STEPS [RUNS]]
set -euo pipefail
out=${1:?an output directory}
steps=${2:-300}
runs=${3:-/tmp/precision-ab}
quiet=(logging.progress=false logging.tensorboard=false --overwrite)
mkdir -p "$out"
python examples/precision-ab/make_data.py
export AB_BASE="$runs/pretrain/final"
if [ ! -d "$AB_BASE" ]; then
  python -m tuneforge train examples/precision-ab/pretrain.yaml run.output_dir="$runs/pretrain" \
    "${quiet[@]}" > "$out/pretrain.log" 2>&1 || { tail -20 "$out/pretrain.log"; exit 1; }
  grep -h "held-out loss" "$out/pretrain.log" | tail -2
fi

for format in ${ROUNDED:-}; do
  [ -d "$runs/base-$format" ] || python bench/rounded_base.py "$AB_BASE" "$runs/base-$format" "$format"
done

one_run() {  # PRECISION SEED [ROUNDED_FORMAT]
  local name="ab-$1${3:+-$3w}-s$2" base="$AB_BASE"
  local limit="${LIMIT:-210s}"
  [ "$1" != fp4 ] || limit="${FP4_LIMIT:-600s}"
  [ -z "${3:-}" ] || base="$runs/base-$3"
  AB_BASE="$base" python -m tuneforge train "examples/precision-ab/$1.yaml" run.name="$name" \
    run.output_dir="$runs/$name" train.seed="$2" train.max_steps="$steps" \
    train.time_limit="$limit" "${quiet[@]}" > "$out/$name.log" 2>&1 \
    || { echo "$name failed:"; tail -20 "$out/$name.log"; }
  mkdir -p "$out/$name"
  cp "$runs/$name/metrics.jsonl" "$runs/$name/config.yaml" "$out/$name/" || true
  echo "$name: $(grep -h "held-out loss" "$out/$name.log" | tail -1)"
}

for seed in ${SEEDS:-0 1 2}; do
  for precision in ${PRECISIONS-bf16 fp8 fp4}; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n; done
    one_run "$precision" "$seed" &
  done
  for format in ${ROUNDED:-}; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n; done
    one_run bf16 "$seed" "$format" &
  done
done
wait
export COLUMNS=140
for seed in ${SEEDS:-0 1 2}; do
  others=$(ls -d "$out"/ab-*-s"$seed"/ | grep -v "/ab-bf16-s$seed/\$" || true)
  python -m tuneforge compare "$out/ab-bf16-s$seed/" $others --out "$out/ab-s$seed.png" || true
done
# every run at once: the runs of each precision grouped, their gaps against bf16's spread
others=$(ls -d "$out"/ab-*/ | grep -v "/ab-bf16-s[0-9]*/\$" || true)
python -m tuneforge compare "$out"/ab-bf16-s*/ $others || true
