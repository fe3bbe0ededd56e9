"""Ratios of each tuneforge run to the peers on the same workload in the same round: to HF +
PEFT (its fastest run) and to the fastest peer run; each multi-GPU run's scaling against one GPU;
and each run's spread over the rounds."""

import statistics

from tuneforge.bench.workloads import baseline_variant


def ratios(results: list[dict]) -> list[tuple[float | None, float | None]]:
    peers: dict[tuple[str, int], list[dict]] = {}
    for result in results:
        if "error" not in result and result["system"] != "tuneforge":
            peers.setdefault(_place(result), []).append(result)
    rows: list[tuple[float | None, float | None]] = []
    for result in results:
        runs = peers.get(_place(result), [])
        if "error" in result or result["system"] != "tuneforge" or not runs:
            rows.append((None, None))
            continue
        hf = [r["tokens_per_s"] for r in runs if r["system"] == "hf+peft"]
        best = max(r["tokens_per_s"] for r in runs)
        speed = result["tokens_per_s"]
        rows.append((speed / max(hf) if hf else None, speed / best))
    return rows


def scaling(results: list[dict]) -> list[dict]:
    """Each multi-GPU tuneforge run against the one-GPU run of the same work per GPU in the same
    round: its tokens/s over the GPUs times one GPU's (1.0: perfect scaling)."""
    single = {
        (*_place(r), r["variant"]): r["tokens_per_s"]
        for r in results
        if "error" not in r and r.get("variant_run", "").endswith("+1gpu")
    }
    rows = []
    for result in results:
        if "error" in result or result.get("gpus", 1) == 1:
            continue
        one_gpu = single.get((*_place(result), baseline_variant(result["variant"])))
        speed = result["tokens_per_s"]
        rows.append(
            {
                "workload": result["workload"],
                "variant": result["variant"],
                "round": result.get("round", 1),
                "gpus": result["gpus"],
                "tokens_per_s": speed,
                "one_gpu_tokens_per_s": one_gpu,
                "efficiency": speed / (result["gpus"] * one_gpu) if one_gpu else None,
            }
        )
    return rows


def over_rounds(results: list[dict]) -> list[dict]:
    """Each run (workload, system, variant) over the rounds it completed: the median, lowest and
    highest tokens/s, in the order the runs first appear."""
    runs: dict[tuple[str, str, str], list[float]] = {}
    for result in results:
        key = (result["workload"], result["system"], result.get("variant", ""))
        speeds = runs.setdefault(key, [])
        if "error" not in result:
            speeds.append(result["tokens_per_s"])
    return [
        {
            "workload": workload,
            "system": system,
            "variant": variant,
            "rounds": len(speeds),
            "median_tokens_per_s": statistics.median(speeds) if speeds else None,
            "lowest": min(speeds, default=None),
            "highest": max(speeds, default=None),
        }
        for (workload, system, variant), speeds in runs.items()
    ]


def _place(result: dict) -> tuple[str, int]:
    return result["workload"], result.get("round", 1)
