"""`tuneforge bench`: tuneforge against HF + PEFT (with Liger) and Unsloth on the same shapes and
tokens per step, in one call; a table, and a JSON file of every run."""

import contextlib
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuneforge.cli.common import console
from tuneforge.errors import TuneforgeError


def bench_command(
    workload: Annotated[
        list[str] | None,
        typer.Option(help="Workload to run (repeatable; default: all that fit the GPUs here)."),
    ] = None,
    peers: Annotated[
        str,
        typer.Option(
            help="Peers, comma-separated: hf+peft, hf+peft+liger, unsloth (SFT workloads), trl "
            "(DPO workloads), or none."
        ),
    ] = "hf+peft,hf+peft+liger,unsloth,trl",
    variant: Annotated[
        list[str] | None,
        typer.Option(help="tuneforge variants instead of each workload's (e.g. compiled+full)."),
    ] = None,
    steps: Annotated[
        int,
        typer.Option(
            help="Timed steps (their mean is reported; tuneforge's rounded up to whole cycles "
            "of its 4 packed batches)."
        ),
    ] = 12,
    warmup: Annotated[
        int, typer.Option(min=0, help="Untimed steps first (compilation included).")
    ] = 6,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the JSON results (default: $XDG_DATA_HOME/tuneforge/bench, outside "
            "the checkout)."
        ),
    ] = None,
    profile: Annotated[
        bool,
        typer.Option(
            help="Also profile tuneforge's runs: top kernels, host time, the memory peak."
        ),
    ] = False,
    run_limit: Annotated[
        float | None,
        typer.Option(help="Seconds one run may take; a longer one is stopped and reported."),
    ] = None,
    enforce_cap: Annotated[
        bool,
        typer.Option(
            help="Run capped workloads (workload 2) with the allocator held to the cap, as on a "
            "GPU of that size, instead of only reporting the peak against it."
        ),
    ] = False,
    cap_gib: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="Hold every run's allocator to this many GiB, as on a GPU of that size (with "
            "--enforce-cap: instead of the capped workload's own cap).",
        ),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            help="Repeat the whole set of runs this many times, interleaved (a machine drifts "
            "by a few % between calls, less within one); each run's median and range follow.",
        ),
    ] = 1,
) -> None:
    """Benchmark one training step: tokens/s, ms/step, peak memory, MFU and ratios."""
    import torch

    from tuneforge.bench.provenance import default_results_dir, tuneforge_commit
    from tuneforge.bench.report import scaling
    from tuneforge.bench.runner import (
        PEERS,
        available_peers,
        execute,
        held_cap,
        needs_fp8,
        plan_runs,
        run_gpus,
        summarise,
    )
    from tuneforge.bench.workloads import WORKLOADS, Variant
    from tuneforge.hardware.gpus import PEAK_TFLOPS, peak_tflops_of

    for name in variant or []:
        Variant.parse(name)  # a bad option stops here, before any GPU time is spent
    if not torch.cuda.is_available():
        raise TuneforgeError("tuneforge bench needs a CUDA or ROCm GPU")
    gpus = torch.cuda.device_count()
    names = workload or [name for name, w in WORKLOADS.items() if w.gpus <= gpus]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise TuneforgeError(f"unknown workload(s) {unknown}: choose from {', '.join(WORKLOADS)}")
    wanted = [] if peers == "none" else [p.strip() for p in peers.split(",")]
    bad = [p for p in wanted if p not in PEERS]
    if bad:
        raise TuneforgeError(f"unknown peer(s) {bad}: choose from {', '.join(PEERS)} or none")
    present, missing = available_peers(wanted)
    for peer, why in missing.items():
        console.print(f"[yellow]{peer} left out: {why}[/yellow]")
    selected = [WORKLOADS[name] for name in names]
    if variant:
        from dataclasses import replace

        selected = [replace(w, variants=tuple(variant)) for w in selected]
    device_name = torch.cuda.get_device_name()
    peak = peak_tflops_of(device_name) or PEAK_TFLOPS["H100"]
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tuneforge_commit": tuneforge_commit(),
        "gpu": device_name,
        "gpus": gpus,
        "peak_tflops_bf16": peak,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "versions": _versions(),
        "command": " ".join(["tuneforge", *sys.argv[1:]]),
        "environment": {
            key: value
            for key, value in sorted(os.environ.items())
            if key.startswith("NCCL_") or key.endswith("_ALLOC_CONF")
        },
        "peers_left_out": missing,
        "results": [],
    }
    out = out or default_results_dir()
    out.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace(":", "").replace("-", "").replace("+0000", "Z")
    file = out / f"bench-{stamp}.json"
    results = record["results"]
    runs = plan_runs(selected, present)
    too_few = [run for run in runs if run_gpus(run) > gpus]
    for run in too_few:
        console.print(
            f"[yellow]{run.workload}: {run.variant} left out: it needs "
            f"{run_gpus(run)} GPUs, {gpus} here[/yellow]"
        )
    if not _fp8_here():
        for run in [run for run in runs if needs_fp8(run) and run not in too_few]:
            too_few.append(run)
            console.print(
                f"[yellow]{run.workload}: {run.variant} left out: FP8 needs FP8 tensor cores, "
                "which this GPU lacks[/yellow]"
            )
    for round_index in range(1, rounds + 1):
        for run in [run for run in runs if run not in too_few]:
            cap = held_cap(WORKLOADS[run.workload], enforce_cap, cap_gib)
            console.print(
                f"[dim]{run.workload}: {run.system} {run.variant or ''} (round {round_index})[/dim]"
            )
            result = execute(run, warmup, steps, profile, run_limit, cap)
            result = summarise(result, peak) | {"round": round_index}
            results.append(result)
            _print_line(result)
            record["scaling"] = scaling(results)
            # written after every run, so that a benchmark cut off by a time limit keeps the rest
            file.write_text(json.dumps(record, indent=2))
    console.print(summary_table(results))
    multi_gpu = scaling_table(results)
    if multi_gpu.row_count:
        console.print(multi_gpu)
    if rounds > 1:
        console.print(rounds_table(results))
    console.print(f"results: {file}")


def _fp8_here() -> bool:
    import torch

    from tuneforge.hardware.gpus import low_precision_cores

    if not torch.cuda.is_available():
        return False
    properties = torch.cuda.get_device_properties(0)
    arch = getattr(properties, "gcnArchName", "") or ""
    return low_precision_cores((properties.major, properties.minor), arch)["fp8"]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("tuneforge", "transformers", "peft", "liger-kernel", "unsloth", "triton"):
        with contextlib.suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


def _print_line(result: dict) -> None:
    if "error" in result:
        console.print(f"  [red]failed: {result['error']}[/red]")
    else:
        cap = result.get("memory_cap_gib")
        held = f", allocator held to {cap:g} GiB" if cap else ""
        console.print(
            f"  {result['tokens_per_s']:,.0f} tokens/s, {result['ms_per_step']:.1f} ms/step, "
            f"peak {result['peak_alloc_gib']:.2f} GiB allocated, "
            f"{result['peak_reserved_gib']:.2f} reserved, MFU {result['mfu']:.0%}{held}"
        )
        stall = slowest_step(result)
        if stall:
            console.print(
                f"  [yellow]one step took {stall[0]:.1f} ms, {stall[1]:.1f}x the median[/yellow] "
                "(a stall: the mean counts it)"
            )
        retries = result.get("allocator_per_step", {}).get("num_alloc_retries", 0)
        if retries:
            console.print(
                f"  [yellow]{retries:g} allocator retries per step[/yellow] (no cached block"
                " fitted under the memory limit: the cache was freed, waiting for the GPU)"
            )
        clocks = result.get("gpu_clocks", {})
        if "sm_clock_mhz" in clocks:
            from tuneforge.bench.gpu_clocks import describe

            console.print(f"  {describe(clocks)}")
    profile = result.get("profile")
    if profile:
        # against the unprofiled step: the profiler's own wall time is inflated by its overhead
        busy, step_ms = profile["gpu_busy_ms_per_step"], result.get("ms_per_step")
        share = f" ({busy / step_ms:.0%})" if step_ms else ""
        console.print(f"  kernels {busy:.1f} ms per step{share}; top kernels:")
        for kernel in profile["top_kernels"][:8]:
            console.print(f"    {kernel['ms_per_step']:8.2f} ms  {kernel['kernel'][:90]}")
        by_rank = profile.get("timeline_by_rank") or [profile.get("timeline")]
        for rank, spans in enumerate(by_rank):
            if spans:
                who = f"rank {rank} " if len(by_rank) > 1 else ""
                console.print(
                    f"  {who}timeline per step: compute {spans['compute']:.1f} ms, collectives "
                    f"{spans['collectives']:.1f} ms ({spans['exposed_collectives']:.1f} ms with no "
                    f"compute beside them), idle {spans['idle']:.1f} ms"
                )
        gaps = profile.get("idle_gaps")
        if gaps:
            bins = ", ".join(f"{key} {ms:.1f} ms" for key, ms in gaps["ms_per_step"].items())
            console.print(f"  idle gaps per step ({gaps['count_per_step']:.0f}): {bins}; longest:")
            for gap in gaps["longest"][:5]:
                console.print(
                    f"    {gap['ms']:8.3f} ms  after {gap['after'][:40]} before {gap['before'][:40]}"
                )
        console.print("  most host time (profiled, so inflated):")
        for op in profile.get("top_host_ops", [])[:5]:
            console.print(f"    {op['host_ms_per_step']:8.2f} ms  {op['op'][:90]}")
        memory = profile.get("memory")
        if memory:
            console.print(
                f"  memory: {memory['allocated_before_gib']:.2f} GiB before the step, peak "
                f"{memory['step_peak_above_before_gib']:.2f} GiB above it; alive at the peak:"
            )
            for site in memory["live_at_peak"][:8]:
                console.print(f"    {site['gib']:8.3f} GiB  {site['site'][:90]}")
            cache = memory.get("cache")
            if cache:
                console.print(
                    f"  allocator cache by stream (at most {cache['awaiting_free_peak_gib']:.2f} "
                    "GiB waited at once for another stream):"
                )
                for stream, gib in cache["by_stream"].items():
                    console.print(
                        f"    {stream}: {gib['reserved_gib']:.2f} GiB reserved, "
                        f"{gib['allocated_gib']:.2f} allocated, {gib['cached_free_gib']:.2f} cached"
                    )


def scaling_table(results: list[dict]) -> Table:
    from tuneforge.bench.report import scaling

    table = Table("workload", "variant", "round", "GPUs", "tokens/s", "1 GPU tokens/s", "scaling")
    table.caption = "scaling: tokens/s over the GPUs times one GPU's, with the same work per GPU"
    for row in scaling(results):
        one_gpu, efficiency = row["one_gpu_tokens_per_s"], row["efficiency"]
        table.add_row(
            row["workload"],
            row["variant"],
            str(row["round"]),
            str(row["gpus"]),
            f"{row['tokens_per_s']:,.0f}",
            "not run" if one_gpu is None else f"{one_gpu:,.0f}",
            "" if efficiency is None else f"{efficiency:.1%}",
        )
    return table


STALL_FACTOR = 2.0


def slowest_step(result: dict) -> tuple[float, float] | None:
    """(ms, times the median) of the slowest timed step, where it took over `STALL_FACTOR` times
    the median."""
    steps, median = result.get("ms_per_step_all"), result.get("ms_per_step_median")
    if not steps or not median:
        return None
    slowest = max(steps)
    return (slowest, slowest / median) if slowest > STALL_FACTOR * median else None


def rounds_table(results: list[dict]) -> Table:
    from tuneforge.bench.report import over_rounds

    table = Table("workload", "system", "variant", "rounds", "median tokens/s", "range")
    for row in over_rounds(results):
        median = row["median_tokens_per_s"]
        table.add_row(
            row["workload"],
            row["system"],
            row["variant"],
            str(row["rounds"]),
            "failed" if median is None else f"{median:,.0f}",
            "" if median is None else f"{row['lowest']:,.0f}–{row['highest']:,.0f}",
        )
    return table


def summary_table(results: list[dict]) -> Table:
    from tuneforge.bench.report import ratios

    table = Table("workload", "system", "variant", "tokens/s", "ms/step", "peak GiB", "MFU",
                  "SM MHz", "vs HF+PEFT", "vs fastest peer")  # fmt: skip
    if any("sm_clock_mhz" in r.get("gpu_clocks", {}) for r in results):
        table.caption = "SM MHz: the median clock over the timed steps; *: held by the power cap"
    for result, (vs_hf, vs_best) in zip(results, ratios(results), strict=True):
        if "error" in result:
            table.add_row(result["workload"], result["system"], result.get("variant", ""), "failed")
            continue
        table.add_row(
            result["workload"],
            result["system"],
            result.get("variant") or "",
            f"{result['tokens_per_s']:,.0f}",
            f"{result['ms_per_step']:.1f}",
            f"{result['peak_alloc_gib']:.1f}",
            f"{result['mfu']:.0%}",
            _clock(result),
            f"{vs_hf:.2f}x" if vs_hf else "",
            f"{vs_best:.2f}x" if vs_best else "",
        )
    return table


def _clock(result: dict) -> str:
    """The median SM clock over the timed steps, `*` where the power cap held it down in most
    samples (a board at its cap: its speed follows the clock it holds there)."""
    clocks = result.get("gpu_clocks", {})
    if "sm_clock_mhz" not in clocks:
        return ""
    capped = clocks["held_down_share"].get("power cap", 0.0) > 0.5
    return f"{clocks['sm_clock_mhz']:,.0f}{'*' if capped else ''}"
