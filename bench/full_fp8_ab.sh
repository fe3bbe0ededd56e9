#!/usr/bin/env bash
# Full fine-tuning in FP8 against bf16 on one GPU: examples/precision-ab/pretrain.yaml (the
# Llama-3.2-1B shape trained from random weights, 300 steps) in bf16, in FP8 through tuneforge's
# own products and through torchao's float8 training, and the torchao one under FSDP2 (one rank:
# its FP8 all-gather runs), all at once; then the held-out losses side by side. Their tokens/s
# are not comparable (the runs share the GPU).
#   [STEPS=300] [LIMIT=330s] bash bench/full_fp8_ab.sh OUT_DIR [RUNS]
set -euo pipefail
out=${1:?an output directory}
runs=${2:-/tmp/full-fp8-ab}
mkdir -p "$out"
python examples/precision-ab/make_data.py > /dev/null
common=(train.max_steps="${STEPS:-300}" train.time_limit="${LIMIT:-330s}" logging.progress=false
        logging.tensorboard=false --overwrite)
ours=(precision.fp8=e4m3)
torchao=(precision.fp8=e4m3 precision.fp8_scaling=tensorwise precision.fp8_implementation=torchao)
one() {  # NAME LAUNCHER OVERRIDES...
  local name=$1 launcher=$2; shift 2
  local command=(python -m tuneforge train)
  [ "$launcher" != fsdp ] || command=(torchrun --standalone --nproc_per_node=1 -m tuneforge train)
  "${command[@]}" examples/precision-ab/pretrain.yaml run.name="full-$name" \
    run.output_dir="$runs/$name" "${common[@]}" "$@" > "$out/full-$name.log" 2>&1 \
    || { echo "$name failed:"; tail -20 "$out/full-$name.log"; }
}
one bf16 plain &
one fp8 plain "${ours[@]}" &
one fp8-torchao plain "${torchao[@]}" &
one fp8-torchao-fsdp fsdp parallel.strategy=fsdp "${torchao[@]}" &
wait
for log in "$out"/full-*.log; do
  echo "== $(basename "$log" .log)"
  grep -h "precision:" "$log" | sed 's/^.*precision: /  /' || true
  grep -h "held-out loss" "$log" | tail -3 || true
done
for name in bf16 fp8 fp8-torchao fp8-torchao-fsdp; do
  mkdir -p "$out/full-$name" && cp "$runs/$name/metrics.jsonl" "$out/full-$name/" 2>/dev/null || true
done
