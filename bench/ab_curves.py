"""One line per run directory: held-out loss at each evaluation, training loss every EVERY
steps, and the median tokens/s and peak memory over the logged steps after the first 20.
    python bench/ab_curves.py RUN_DIR ... [--every N]"""

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=30)
    args = parser.parse_args()
    for run in args.runs:
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [line for line in lines if "loss" in line]
        evals = [f"{line['step']}:{line['eval_loss']:.4f}" for line in lines if "eval_loss" in line]
        curve = [f"{line['loss']:.3f}" for line in steps if line["step"] % args.every == 0]
        timed = [line for line in steps if line["step"] > 20]
        speed = statistics.median(line["tokens_per_s"] for line in timed) if timed else 0.0
        peak = max((line.get("mem_peak_gib") or 0.0 for line in steps), default=0.0)
        reserved = max((line.get("mem_reserved_gib") or 0.0 for line in steps), default=0.0)
        print(
            f"{run.name}: eval {' '.join(evals)} | train/{args.every} {' '.join(curve)} | "
            f"{speed:,.0f} tokens/s, peak {peak:.2f} GiB allocated, {reserved:.2f} reserved"
        )


if __name__ == "__main__":
    main()
