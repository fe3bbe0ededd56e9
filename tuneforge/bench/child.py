"""One benchmark run in its own process (a fresh CUDA context and peak-memory count):
`python -m tuneforge.bench.child SPEC_JSON` prints one JSON line prefixed with RESULT_PREFIX."""

import json
import os
import sys
import traceback

from tuneforge.hardware.gpus import GIB

RESULT_PREFIX = "TUNEFORGE_BENCH_RESULT "


def main(spec: dict) -> dict:
    from tuneforge.bench.workloads import WORKLOADS

    workload = WORKLOADS[spec["workload"]]
    warmup, steps = spec["warmup"], spec["steps"]
    if spec.get("memory_cap_gib"):
        enforce_memory_cap(spec["memory_cap_gib"])
    system = spec["system"]
    if system == "tuneforge":
        from tuneforge.bench.ours import run_ours

        return run_ours(workload, spec["variant"], warmup, steps, spec.get("profile", False))
    checkpointing = spec["checkpointing"]
    if system in ("hf+peft", "hf+peft+liger"):
        from tuneforge.bench.peers import run_hf

        return run_hf(workload, system == "hf+peft+liger", checkpointing, warmup, steps)
    if system == "unsloth":
        from tuneforge.bench.peers import run_unsloth

        return run_unsloth(workload, checkpointing, warmup, steps)
    if system == "trl" and workload.objective == "grpo":
        from tuneforge.bench.peers_trl_grpo import run_trl_grpo

        return run_trl_grpo(workload, checkpointing, warmup, steps)
    if system == "trl":
        from tuneforge.bench.peers_trl import run_trl_dpo

        return run_trl_dpo(workload, checkpointing, warmup, steps)
    raise ValueError(f"unknown system {system!r}")


def enforce_memory_cap(cap_gib: float) -> None:
    """The caching allocator may reserve at most `cap_gib` (as on a GPU of that size: past it,
    it frees its cached blocks, waiting for the GPU, before it gives up)."""
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * GIB / total))


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    try:
        result = main(request)
    except Exception as error:  # reported, not raised: the benchmark goes on with other runs
        result = {
            "error": f"{type(error).__name__}: {error}",
            "trace": traceback.format_exc()[-3000:],
        }
        result["is_main"] = True
    if result.pop("is_main", True):
        print(RESULT_PREFIX + json.dumps(request | result), flush=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from tuneforge.parallel.distributed import exit_rank

        exit_rank(0)  # a measured run's ranks end as `tuneforge train` ends them
