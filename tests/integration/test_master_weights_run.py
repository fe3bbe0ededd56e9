"""The demo shape fully fine-tuned for 300 steps in bf16 over fp32 master weights ends as the fp32
run does, within what this measurement can resolve; how far pure bf16 (weights and AdamW states
in bf16) ends from it is recorded beside.

The demo's held-out loss at step 300 moves by more than its two fp32 seeds do (0.3000, 0.3113:
3.8%) under changes of rounding alone: pure bf16 ended at 0.2801 and 0.3319 with two attention
kernels of equal exactness (+18%), master weights at 0.3143 and 0.3386, and master weights at
seed 1 +3.4% from fp32's seed 1 where seed 0 is +12.9% (bench/RESULTS.md, "trained 16-bit
weights"). The tolerance is that noise floor: a run whose weights stopped learning, or learnt at
another rate, lands far outside it."""

import subprocess
import sys
from pathlib import Path

from tuneforge.runs.files import read_metrics

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"
NOISE_FLOOR = 0.18
"""How far one setting's held-out loss at step 300 moved under a change of rounding alone."""
ARMS = {
    "fp32": ["model.dtype=float32"],
    "master": ["model.dtype=bfloat16", "precision.master_weights=true"],
    "pure": ["model.dtype=bfloat16", "precision.master_weights=false"],
}


def held_out_after_300_steps(run_dir: Path, *overrides: str) -> float:
    args = [sys.executable, "-m", "tuneforge", "train", str(DEMO), f"run.output_dir={run_dir}"]
    args += [f"data.cache_dir={run_dir.parent / 'cache'}", "train.max_steps=300"]
    args += ["eval.every_steps=100", "eval.num_samples=0", "logging.progress=false"]
    args += ["logging.tensorboard=false", "checkpoint.save_final=false", *overrides, "--overwrite"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    evaluations = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval_loss" in r]
    assert evaluations[-1]["step"] == 300
    return evaluations[-1]["eval_loss"]


def test_master_weights_end_as_fp32_does_within_the_noise_floor(tmp_path, record_property):
    held_out = {
        name: held_out_after_300_steps(tmp_path / name, *args) for name, args in ARMS.items()
    }
    master_gap = held_out["master"] / held_out["fp32"] - 1
    pure_gap = held_out["pure"] / held_out["fp32"] - 1
    record_property("held_out", held_out)
    record_property("pure_bf16_gap", pure_gap)
    print(f"held-out at 300: {held_out}; master {master_gap:+.1%}, pure bf16 {pure_gap:+.1%}")
    assert abs(master_gap) <= NOISE_FLOOR, held_out
