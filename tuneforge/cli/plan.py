"""`tuneforge plan`: memory per GPU, step time, ETA and jobs, and what-if comparisons."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuneforge.api.planning import record_lengths
from tuneforge.cli.common import console
from tuneforge.config.errors import ConfigError
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
        list[Path] | None,
        typer.Option(
            help="Fit the step-time model's rates to measured steps: a bench JSON (`tuneforge "
            "bench --out`) or a run directory (repeatable); used for this plan."
        ),
    ] = None,
    save_rates: Annotated[
        Path | None, typer.Option(help="Write the rates --calibrate fitted to this JSON file.")
    ] = None,
    rates: Annotated[
        Path | None, typer.Option(help="Step-time rates written by --calibrate --save-rates.")
    ] = None,
    fit: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Search the memory and speed options for the fastest recipes whose reserved "
            "memory fits in this many GiB per GPU.",
        ),
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
    from tuneforge.api.configuration import reading
    from tuneforge.api.planning import plan as predict
    from tuneforge.config import load_config

    if master_weights is not None:
        overrides = [*(overrides or []), f"precision.master_weights={str(master_weights).lower()}"]
    if save_rates is not None and not calibrate:
        raise TuneforgeError("--save-rates writes what --calibrate fits: give --calibrate too")
    if rates is not None and calibrate:
        raise TuneforgeError("--rates and --calibrate both give the rates: use one")
    with reading(not no_data):  # a configuration's mistakes reported before the heavy imports
        loaded = load_config(config, overrides or [])
    step_rates = _load_rates(rates) if rates is not None else None
    if calibrate:
        from tuneforge.api.planning import refuse_unknown_gpu, target_hardware
        from tuneforge.plan.prediction import Hardware

        named, _ = target_hardware(gpu)
        refuse_unknown_gpu(named, gpu_mem)  # before fitting, and before --save-rates writes
        step_rates = _calibrated(calibrate, Hardware(gpus, nodes, named, gpu_mem))
        if save_rates is not None:
            step_rates.save(save_rates)
            console.print(f"rates written to {save_rates}", markup=False, highlight=False)
    try:
        result = predict(
            loaded, gpu=gpu, gpus=gpus, nodes=nodes, gpu_mem=gpu_mem, time_limit=time_limit,
            fit_gib=fit, what_if=what_if or [], with_data=not no_data, rates=step_rates,
        )  # fmt: skip
    except ConfigError as error:  # named as `train` names it: by the configuration file
        raise ConfigError(error.issues, error.source or str(config)) from None
    if result.recipes is not None:
        assert fit is not None
        _print_recipes(result.recipes, fit, as_json)
        return
    assert result.plan is not None
    plan, layouts, hardware, target = (
        result.plan,
        result.layouts,
        result.hardware,
        result.planned_for,
    )
    from tuneforge.config.durations import format_duration
    from tuneforge.hardware.gpus import GIB

    gpu = hardware.gpu
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
        f"step {plan.step_time_s:.3f} s, "
        + (
            f"{plan.steps} steps, ETA {format_duration(plan.eta_h * 3600)}"
            if plan.steps is not None and plan.eta_h is not None
            else "steps unknown without the data (set train.max_steps, or plan with the data): "
            "no ETA"
        )
        + (f", {plan.jobs_needed} job(s) under the limit" if plan.jobs_needed else ""),
        markup=False,
        highlight=False,
    )
    parts = ", ".join(
        f"{name} {seconds * 1000:.1f}" for name, seconds in plan.step_parts.items() if seconds
    )
    clock = f"; clock held at {plan.clock:.0%} by the power cap" if plan.clock < 1 else ""
    console.print(
        f"  step by part (ms): {parts}; bound by {plan.step_bound}{clock}; rates: {plan.rates}",
        markup=False,
        highlight=False,
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


def _load_rates(file: Path):
    from tuneforge.hardware.step_rates import load_rates

    try:
        return load_rates(file)
    except ValueError as error:
        raise TuneforgeError(f"--rates: {error}") from None


def _calibrated(sources: list[Path], hardware):
    """The rates fitted to the measured steps of bench JSONs and run directories."""
    from tuneforge.bench.measured import measured_sample, read_bench_results
    from tuneforge.config import load_config
    from tuneforge.plan.calibration import fit_rates
    from tuneforge.plan.measured_runs import run_sample

    samples = []
    for source in sources:
        if source.is_dir():
            run_lengths = record_lengths(load_config(source / "config.yaml"))
            samples.append(run_sample(source, hardware, run_lengths))
        elif source.is_file():
            samples += [measured_sample(m, hardware.gpu) for m in read_bench_results(source)]
        else:
            raise TuneforgeError(f"--calibrate {source}: no such file or directory")
    if not samples:
        raise TuneforgeError(
            f"--calibrate: no measured tuneforge steps in {', '.join(map(str, sources))}"
        )
    names = ", ".join(source.name for source in sources)
    name = f"{hardware.gpu} rates fitted on {len(samples)} measured step(s) of {names}"
    return fit_rates(samples, hardware.step_rates, name)


def _print_recipes(found, fit_gib: float, as_json: bool) -> None:
    rows = [
        {
            "overrides": recipe.overrides,
            "step_time_s": recipe.step_time_s,
            "tokens_per_s": recipe.tokens_per_s,
            "reserved_gib": recipe.reserved_gib,
            "allocated_gib": recipe.allocated_gib,
            "bound": recipe.bound,
        }
        for recipe in found.recipes
    ]
    if as_json:
        console.print(
            json.dumps({"fit_gib": fit_gib, "rates": found.rates, "recipes": rows,
                        "searched": found.searched, "least_gib": found.least_gib}, indent=2),
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        return
    console.print(
        f"{found.searched} recipes searched; the fastest whose reserved memory fits in "
        f"{fit_gib:g} GiB (rates: {found.rates}):",
        markup=False,
        highlight=False,
    )
    if not rows:
        console.print(
            f"[red]none fits in {fit_gib:g} GiB (0.25 of it kept free): the least a recipe "
            f"holds is {found.least_gib:.1f} GiB; more GPUs (--gpus) share the model, a "
            "shorter data.max_seq_len shrinks the activations[/red]"
        )
        return
    table = Table("#", "tokens/s", "step s", "reserved GiB", "allocated GiB", "bound by")
    for index, row in enumerate(rows, start=1):
        table.add_row(
            str(index),
            f"{row['tokens_per_s']:,.0f}",
            f"{row['step_time_s']:.3f}",
            f"{row['reserved_gib']:.2f}",
            f"{row['allocated_gib']:.2f}",
            row["bound"],
        )
    console.print(table)
    for index, row in enumerate(rows, start=1):
        console.print(
            f"{index}: {' '.join(row['overrides']) or '(as configured)'}",
            markup=False,
            highlight=False,
        )


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
