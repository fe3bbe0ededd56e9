"""Ratios of each tuneforge run to the peers on the same workload: to HF + PEFT (its fastest
run) and to the fastest peer run."""


def ratios(results: list[dict]) -> list[tuple[float | None, float | None]]:
    peers: dict[str, list[dict]] = {}
    for result in results:
        if "error" not in result and result["system"] != "tuneforge":
            peers.setdefault(result["workload"], []).append(result)
    rows = []
    for result in results:
        runs = peers.get(result["workload"], [])
        if "error" in result or result["system"] != "tuneforge" or not runs:
            rows.append((None, None))
            continue
        hf = [r["tokens_per_s"] for r in runs if r["system"] == "hf+peft"]
        best = max(r["tokens_per_s"] for r in runs)
        speed = result["tokens_per_s"]
        rows.append((speed / max(hf) if hf else None, speed / best))
    return rows
