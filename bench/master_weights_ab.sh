#!/usr/bin/env bash
# Full fine-tuning A/B of how the trained weights keep their precision: an fp32 reference, pure
# bf16 weights and AdamW states, fp32 master weights, compensated (Kahan) bf16 updates, and any
# extra arm, each over SEEDS; then the held-out losses side by side (tuneforge compare).
#   [SEEDS="0 1"] [JOBS=N] [ARMS="fp32 bf16 master compensated"] [EXTRA="name:k=v k=v;..."] \
#     bash bench/master_weights_ab.sh CONFIG OUT_DIR [key=value ...]
# CONFIG: examples/demo.yaml (CPU) or examples/precision-ab/pretrain.yaml (GPU, the 1B shape).
# The fp32 arm on a GPU computes its GEMMs in TF32 (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1). Runs
# sharing a machine (JOBS > 1) report tokens/s that are not comparable; bench/ measures speed.
set -euo pipefail
config=${1:?a config}; out=${2:?an output directory}; shift 2
overrides=("$@")
mkdir -p "$out"
declare -A arm_args=(
  [fp32]="model.dtype=float32"
  [bf16]="model.dtype=bfloat16 precision.master_weights=false"
  [master]="model.dtype=bfloat16 precision.master_weights=true"
  [compensated]="model.dtype=bfloat16 precision.master_weights=compensated"
)
arms=${ARMS:-fp32 bf16 master compensated}
IFS=';' read -ra extras <<< "${EXTRA:-}"
for extra in "${extras[@]}"; do arm_args[${extra%%:*}]="${extra#*:}"; arms="$arms ${extra%%:*}"; done
run() {  # ARM SEED
  local arm=$1 seed=$2 name="$1-s$2"
  # shellcheck disable=SC2086
  TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 python -m tuneforge train "$config" run.name="ab-$name" \
    run.output_dir="$out/$name" train.seed="$seed" logging.progress=false \
    logging.tensorboard=false eval.num_samples=0 ${arm_args[$arm]} "${overrides[@]}" --overwrite \
    > "$out/$name.log" 2>&1 || { echo "$name failed:"; tail -20 "$out/$name.log"; }
}
for seed in ${SEEDS:-0 1}; do
  for arm in $arms; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n; done
    run "$arm" "$seed" &
  done
done
wait
for log in "$out"/*.log; do
  printf '%-22s %s | %s\n' "$(basename "$log" .log)" \
    "$(grep -h "held-out loss" "$log" | tail -1 | sed 's/.*held-out loss //')" \
    "$(grep -h "trained weights:" "$log" | sed 's/.*trained weights: //' | head -1)"
done
