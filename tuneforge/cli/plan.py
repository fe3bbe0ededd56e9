"""`tuneforge plan`: memory per GPU, step time, ETA and jobs, and what-if comparisons."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuneforge.cli.common import console
from tuneforge.cli.data_lengths import record_lengths
from tuneforge.errors import TuneforgeError


def plan_command(
    config: Annotated[Path, typer.Argument(help="Run configuration (YAML).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Dotted overrides.")] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs per node.")] = 1,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes.")] = 1,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU model (H100, H200, A100, B200, MI250X, MI300X, MI355X) or CPU; "
            "default: the GPU here, else this machine's CPU."
        ),
    ] = None,
    gpu_mem: Annotated[
        float | None, typer.Option(min=1, help="GPU memory in GiB (default: the model's).")
    ] = None,
    time_limit: Annotated[
        str | None, typer.Option(help="Job time limit (HH:MM:SS, D-HH:MM:SS, 4h).")
    ] = None,
    what_if: Annotated[
        list[str] | None, typer.Option(help="A changed setting, key=value (repeatable).")
    ] = None,
    calibrate: Annotated[
        Path | None, typer.Option(help="A measured run directory: use its MFU.")
    ] = None,
    master_weights: Annotated[
        bool | None,
        typer.Option(
            help="Set precision.master_weights (true: fp32 masters and AdamW states; false: "
            "states in the weights' dtype); the configuration's value otherwise."
        ),
    ] = None,
    no_data: Annotated[
        bool, typer.Option(help="Do not tokenise the data for its lengths.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Predict per-GPU memory, step time, ETA and jobs needed, before launching."""
    from tuneforge.config import load_config
    from tuneforge.config.hub import without_weights

    if master_weights is not None:
        overrides = [*(overrides or []), f"precision.master_weights={str(master_weights).lower()}"]
    with without_weights():  # a configuration's mistakes reported before the heavy imports
        load_config(config, overrides or [])
    from tuneforge.config.durations import format_duration, parse_duration
    from tuneforge.hardware.gpus import GIB, GPU_MEMORY_GIB
    from tuneforge.plan.planner import measured_mfu, plan_config
    from tuneforge.plan.prediction import CPU, Hardware

    gpu, target = _target(gpu)
    if gpu not in GPU_MEMORY_GIB and gpu != CPU and gpu_mem is None:
        raise TuneforgeError(
            f"--gpu {gpu}: unknown; use one of {', '.join(GPU_MEMORY_GIB)} or CPU, or give "
            "--gpu-mem"
        )
    try:
        limit = parse_duration(time_limit) if time_limit else None
    except ValueError as error:
        raise TuneforgeError(f"--time-limit: {error}") from None
    mfu = measured_mfu(calibrate) if calibrate is not None else None
    hardware = Hardware(gpus, nodes, gpu, gpu_mem, limit, mfu)
    with without_weights():  # a hub model's configuration and tokenizer are enough to plan
        lengths = None if no_data else record_lengths(config, overrides or [])
        plan = plan_config(config, overrides or [], hardware, lengths, what_if or [])
        layouts = []
        if hardware.data_parallel > 1:
            from tuneforge.plan.layouts import plan_layouts

            layouts = plan_layouts(load_config(config, overrides or []), hardware, lengths)
    if as_json:
        console.print(
            json.dumps(
                plan.as_dict() | {"planned_for": target, "layouts": _layout_rows(layouts)},
                indent=2,
            ),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    console.print(f"planned for {target}", markup=False)
    table = Table(
        f"per GPU ({hardware.data_parallel} x {gpu}, {plan.gpu_memory_gib:.0f} GiB)", "GiB"
    )
    for key, value in plan.memory.gib().items():
        table.add_row(key, f"{value:.1f}")
    console.print(table)
    verdict = "fits" if plan.fits else "does NOT fit"
    sharding = f"; {plan.zero_stage_advice}" if plan.strategy == "fsdp" else ""
    console.print(
        f"{verdict}: {plan.gpu_memory_gib - plan.memory.total / GIB:+.1f} GiB headroom{sharding}"
    )
    console.print(
        f"step {plan.step_time_s:.2f} s (MFU {hardware.mfu or 0.4:.0%}{' measured' if mfu else ' assumed'}), "
        f"{plan.steps} steps, ETA {format_duration(plan.eta_h * 3600)}"
        + (f", {plan.jobs_needed} job(s) under the limit" if plan.jobs_needed else "")
    )
    from tuneforge.models.cost import parameter_count

    tokens, model = plan.per_token, plan.model
    console.print(
        f"per token: {tokens['training_gflop']:.2f} GFLOP to train, "
        f"{tokens['activation_mib']:.2f} MiB of activations without checkpointing "
        f"({tokens['attention_kib_per_layer']:.0f} KiB of them attention's, per layer); "
        f"the model: {parameter_count(model['params_b'] * 1e9)} parameters, "
        f"{parameter_count(model['active_params_b'] * 1e9)} active per token, dim {model['dim']:.0f}, {model['layers']:.0f} layers",
        markup=False,
        highlight=False,
    )
    if plan.base_weights:
        console.print(f"precision: {plan.base_weights}", markup=False, highlight=False)
    if plan.objective:
        console.print(f"objective: {plan.objective}", markup=False, highlight=False)
    if hardware.data_parallel > 1:
        console.print(
            f"parallel.strategy {plan.strategy} ({plan.strategy_reason}); collectives: "
            f"{plan.collective_gb_per_step:.2f} GB sent per GPU and optimizer step",
            markup=False,
            highlight=False,
        )
        by_collective = ", ".join(f"{k} {v:.2f}" for k, v in plan.collectives_gb.items())
        console.print(f"  by collective (GB): {by_collective}", markup=False, highlight=False)
    if layouts:
        _print_layouts(layouts, hardware)
    if plan.slowest_rank_factor > 1.0:
        console.print(
            f"each step waits for its slowest rank: +{plan.slowest_rank_factor - 1:.1%} over the "
            f"mean rank's work as configured, +{plan.balanced_slowest_rank_factor - 1:.1%} with "
            "data.balance_ranks (counted in the step time)",
            markup=False,
            highlight=False,
        )
    for problem in plan.problems:
        console.print(f"[red]• {problem}[/red]")
    for line in plan.advice:
        console.print(f"• {line}", markup=False, highlight=False)
    for item in plan.what_if:
        console.print(
            f"what if {item['change']}: {item['speedup']:.2f}x speed, memory x{item['memory_ratio']:.2f} "
            f"({item['memory_gib']:.1f} GiB, {'fits' if item['fits'] else 'does not fit'})",
            markup=False,
        )


def _target(gpu: str | None) -> tuple[str, str]:
    """The hardware to plan for and how it was chosen: as asked, else the GPU here (by its name
    in the tables), else this machine's CPU."""
    from tuneforge.hardware.cpu import cpu_cores
    from tuneforge.hardware.gpus import GPU_MEMORY_GIB
    from tuneforge.plan.prediction import CPU

    if gpu is not None:
        name = CPU if gpu.lower() == "cpu" else gpu
        return name, (f"this machine's CPU ({cpu_cores()} cores)" if name == CPU else name)
    import torch

    if torch.cuda.is_available():
        here = torch.cuda.get_device_name()
        known = next(
            (key for key in sorted(GPU_MEMORY_GIB, key=len, reverse=True) if key in here), None
        )
        if known is not None:
            return known, f"{known}, the GPU here ({here}); --gpu plans for another"
        return "H100", f"H100: the GPU here ({here}) is not in the tables; pass --gpu and --gpu-mem"
    return CPU, f"this machine's CPU ({cpu_cores()} cores, no GPU here); --gpu plans for a GPU"


def _layout_rows(layouts) -> list[dict]:
    from tuneforge.hardware.gpus import GIB

    return [
        {
            "layout": layout.describe(),
            "overrides": layout.overrides,
            "memory_gib": layout.plan.memory.total / GIB,
            "fits": layout.plan.fits,
            "step_time_s": layout.plan.step_time_s,
            "tokens_per_s": 1 / layout.seconds_per_token if layout.seconds_per_token else None,
            "collectives_gb": layout.plan.collectives_gb,
            "cross_node_gb": layout.cross_node_gb,
            "collective_s": layout.collective_s,
        }
        for layout in layouts
    ]


def _print_layouts(layouts, hardware) -> None:
    """The layouts of these GPUs, the proposed one first, with its overrides to paste."""
    table = Table(
        f"layout on {hardware.nodes} x {hardware.gpus}", "GiB/GPU", "fits", "step s", "tokens/s",
        "GB/step", "across nodes", "collectives s",
    )  # fmt: skip
    for row in _layout_rows(layouts)[:10]:
        table.add_row(
            row["layout"],
            f"{row['memory_gib']:.1f}",
            "yes" if row["fits"] else "no",
            f"{row['step_time_s']:.2f}",
            f"{row['tokens_per_s']:,.0f}",
            f"{sum(row['collectives_gb'].values()):.1f}",
            f"{row['cross_node_gb']:.1f}",
            f"{row['collective_s']:.2f}",
        )
    console.print(table)
    best = layouts[0]
    verdict = "proposed" if best.plan.fits else "none fits; the nearest"
    console.print(
        f"{verdict}: {best.describe()} ({' '.join(best.overrides)} parallel.strategy=fsdp)",
        markup=False,
        highlight=False,
    )
