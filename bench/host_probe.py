"""Is a step bound by the host? The same workload at fewer tokens per step: the GPU's work
shrinks with the tokens, the host's (one launch per kernel, whatever its size) does not, so
where the step time stops falling it is the host's time to queue one step.

    python bench/host_probe.py llama3-8b-lora compiled+budget0.8 4096 1024 256

With `HOST_PROFILE=1`, the host's time per Python function over the timed steps (cProfile) is
printed as well: what the host spends a step on.
"""

import cProfile
import dataclasses
import json
import os
import pstats
import sys

from tuneforge.bench.ours import run_ours
from tuneforge.bench.workloads import WORKLOADS


def main() -> None:
    name, variant, *tokens = sys.argv[1:]
    for count in map(int, tokens):
        workload = dataclasses.replace(WORKLOADS[name], tokens=count)
        profiler = cProfile.Profile() if os.environ.get("HOST_PROFILE") else None
        result = run_ours(workload, variant, warmup=4, steps=8, host_profiler=profiler)
        print(
            json.dumps(
                {
                    "workload": name,
                    "variant": variant,
                    "tokens": count,
                    "ms_per_step": round(result["ms_per_step"], 2),
                    "ms_per_step_wall": round(result["ms_per_step_wall"], 2),
                }
            ),
            flush=True,
        )
        if profiler is not None:
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
