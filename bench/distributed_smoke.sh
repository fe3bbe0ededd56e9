#!/usr/bin/env bash
# Two-GPU smoke run of the distributed paths (FSDP2 and DDP) against one GPU, plus a stop at a
# time limit and an exact resume. Run from the repository root on a machine with 2 GPUs:
#   bash bench/distributed_smoke.sh OUT_DIR
set -u
OUT=${1:-bench-out}
mkdir -p "$OUT"
COMMON="logging.progress=false logging.tensorboard=false logging.log_steps=5 data.eval=[] eval.every_steps=null eval.num_samples=0"
MOE="examples/qwen3-moe-proxy.yaml train.max_steps=40 $COMMON"
DENSE="examples/demo.yaml model.name=llama-3.2-1b model.dtype=bfloat16 data.max_seq_len=64 train.tokens_per_micro_batch=8192 train.max_steps=40 train.lr=1e-4 train.min_lr=1e-5 train.warmup_steps=5 $COMMON"
run() {  # name, launcher..., config + overrides
  local name=$1; shift
  local start=$(date +%s)
  "$@" run.output_dir="$OUT/$name" --overwrite > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - start )) s"
}
T2="torchrun --standalone --nproc_per_node=2 -m tuneforge train"
T1="python3 -m tuneforge train"
ONLY=${ONLY:-all}
if [ "$ONLY" = all ] || [ "$ONLY" = moe ]; then
run moe-1gpu $T1 $MOE train.grad_accum_steps=2
run moe-fsdp2 $T2 $MOE parallel.strategy=fsdp
run moe-ddp2 $T2 $MOE parallel.strategy=ddp
fi
if [ "$ONLY" = all ] || [ "$ONLY" = dense ]; then
run dense-full-1gpu $T1 $DENSE train.grad_accum_steps=2 lora.enabled=false
run dense-full-fsdp2-zero3 $T2 $DENSE lora.enabled=false parallel.zero_stage=3
run dense-full-fsdp2-zero2 $T2 $DENSE lora.enabled=false parallel.zero_stage=2
# stop at a 40 s time limit (exit 75), then resume to the end
run dense-limit $T2 $DENSE lora.enabled=false train.time_limit=40s checkpoint.exit_margin_s=5
$T2 $DENSE lora.enabled=false run.output_dir="$OUT/dense-limit" --resume auto > "$OUT/dense-limit-resume.log" 2>&1
echo "dense-limit resume rc=$?"
fi
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'run':26s} {'steps':>5s} {'loss@5':>8s} {'loss@40':>8s} {'tok/s':>9s} {'MFU':>6s} {'peak GiB':>8s}")
for metrics in sorted(out.glob("*/metrics.jsonl")):
    rows = [json.loads(l) for l in metrics.read_text().splitlines() if '"loss"' in l]
    if not rows:
        continue
    at = {r["step"]: r for r in rows}
    steady = [r for r in rows if r["step"] > 10]
    tps = statistics.median(r["tokens_per_s"] for r in steady) if steady else float("nan")
    mfu = [r["mfu"] for r in steady if r.get("mfu") is not None]
    peak = max((r.get("mem_peak_gib") or 0) for r in rows)
    print(f"{metrics.parent.name:26s} {rows[-1]['step']:5d} {at.get(5, {}).get('loss', float('nan')):8.4f} "
          f"{at.get(40, {}).get('loss', float('nan')):8.4f} {tps:9,.0f} {statistics.median(mfu) if mfu else float('nan'):6.1%} {peak:8.1f}")
PY
