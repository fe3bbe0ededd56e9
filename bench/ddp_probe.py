"""DDP's own cost on one GPU: the 1B full fine-tune's step (workload 4) through DDP over a
one-rank process group — gradients copied into its buckets, its hooks, a one-rank all-reduce —
against the plain step, alternating. What DDP's two-GPU step takes beyond it is the GPUs'
exchange and their waiting for each other. `python bench/ddp_probe.py`."""

import json
import os

import torch
import torch.distributed as dist

from tuneforge.bench.ours import run_ours
from tuneforge.bench.workloads import WORKLOADS


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    workload = WORKLOADS["llama3.2-1b-full"]
    for variant in ("compiled", "compiled+ddp", "compiled", "compiled+ddp"):
        result = run_ours(workload, variant, warmup=6, steps=12)
        times = [round(ms, 1) for ms in result["ms_per_step_all"]]
        print(json.dumps({"variant": variant, "ms_per_step": round(result["ms_per_step"], 2),
                          "peak_alloc_gib": round(result["peak_alloc_gib"], 2),
                          "steps_ms": times}))  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
