"""`tuneforge doctor ...`: explain an out-of-memory error, scan a training log, check the machine."""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tuneforge.cli.common import console
from tuneforge.errors import TuneforgeError

doctor_app = typer.Typer(
    help="Diagnose OOMs, training logs and the environment.", no_args_is_help=True
)
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    if not path.is_file():
        raise TuneforgeError(f"{path}: no such file")
    return path.read_text(encoding="utf-8", errors="replace")


def _print(data: dict) -> None:
    console.print(json.dumps(data, indent=2), markup=False, highlight=False, soft_wrap=True)


@doctor_app.command("oom")
def oom(
    source: Annotated[str, typer.Argument(help="File with the error message, or - for stdin.")],
    torch_version: Annotated[
        str | None, typer.Option(help="torch version of the failed run (default: this one's).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="The run's configuration: size each remedy with the planner."),
    ] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of the run (with --config).")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Fragmentation, memory pressure, other processes, the runtime's or the host's memory, and
    what to do."""
    from tuneforge.api.doctoring import doctor_oom

    report = doctor_oom(_read(source), torch_version=torch_version, config=config, gpus=gpus)
    if as_json:
        _print(report.as_dict())
        return
    figures = [
        f"{label} {value:.2f} GiB"
        for label, value in (
            ("requested", report.requested_gib),
            ("total", report.total_gib),
            ("free", report.free_gib),
            ("allocated", report.allocated_gib),
            ("reserved but unallocated", report.reserved_unallocated_gib),
            ("this process", report.this_process_gib),
            ("other processes", report.other_processes_gib),
        )
        if value is not None
    ]
    console.print(
        f"[bold]{report.kind}[/bold]" + (f" ({report.platform})" if report.platform else "")
    )
    if figures:
        console.print(", ".join(figures), markup=False)
    for action in report.actions:
        console.print(f"• {action}", markup=False, highlight=False)


@doctor_app.command("log")
def log(
    source: Annotated[
        str,
        typer.Argument(
            help="Training log file, a run's metrics.jsonl or directory, or - for stdin."
        ),
    ],
    time_limit: Annotated[
        str | None, typer.Option(help="The job's time limit (90m, 4h, HH:MM:SS, D-HH:MM:SS).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="The run's configuration: compare its step time with the planner's."),
    ] = None,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs of the run (with --config).")] = 1,
    gpu: Annotated[
        str, typer.Option(help="The run's GPU model, as `tuneforge plan --gpu` takes it.")
    ] = "H100",
    as_json: JsonOption = False,
) -> None:
    """Allocator warnings, NaNs, restarts from step 0, ETA against the limit, collective errors;
    with --config, the step time against the planner's."""
    from tuneforge.api.doctoring import doctor_log, scan_lines

    if source == "-":
        report = scan_lines(sys.stdin, time_limit, config, gpus, gpu)
    else:
        report = doctor_log(source, time_limit=time_limit, config=config, gpus=gpus, gpu=gpu)
    if as_json:
        _print(report.as_dict())
        return
    if report.step_time_s is not None:
        steps = f"step {report.steps_seen}/{report.total_steps}, " if report.total_steps else ""
        console.print(
            f"{steps}{report.step_time_s:.2f} s/step"
            + (f", ETA {report.eta_s / 3600:.1f} h" if report.eta_s is not None else "")
            + (
                f" (planned {report.planned_step_s:.3f} s/step)"
                if report.planned_step_s is not None
                else ""
            ),
            markup=False,
        )
    if not report.findings:
        console.print("nothing wrong found")
    for finding in report.findings:
        console.print(f"[bold]{finding.code}[/bold] ×{finding.count}: {finding.message}")
        console.print(f"  → {finding.advice}", markup=False, highlight=False)


@doctor_app.command("env")
def env(as_json: JsonOption = False) -> None:
    """GPUs, versions, allocator setting in effect, attention kernels, NCCL/RCCL, HF cache."""
    from tuneforge.api.runs_and_data import doctor_env
    from tuneforge.doctor.extras import describe_extras

    report = doctor_env()
    if as_json:
        _print(report.as_dict())
        return
    platform = " ".join(filter(None, (report.platform, report.platform_version)))
    console.print(f"torch {report.torch} ({platform})", markup=False)
    for gpu in report.gpus:
        power = (
            f", power limit {gpu['power_limit_w']:.0f} W (default "
            f"{gpu['default_power_limit_w']:.0f}), SM clock up to {gpu['sm_clock_max_mhz']:,.0f} MHz"
            if "power_limit_w" in gpu
            else ""
        )
        cores = ", ".join(kind.upper() for kind in ("fp8", "fp4") if gpu.get(kind)) or "none"
        console.print(
            f"GPU {gpu['index']}: {gpu['name']}, {gpu['memory_gib']:.0f} GiB{power}; "
            f"low-precision tensor cores: {cores}",
            markup=False,
        )
    probe = report.expandable_segments_effective
    effect = "no GPU here to probe" if probe is None else ("yes" if probe else "no")
    console.print(
        f"allocator env: {report.allocator_env or 'unset'}; expandable segments in effect: "
        f"{effect}",
        markup=False,
    )
    console.print(
        f"attention (auto): {report.attention_backend}; varlen attention: "
        f"{report.varlen_attention}, flex attention: {report.flex_attention}"
    )
    console.print(f"NCCL/RCCL variables: {report.collective_env or 'none'}", markup=False)
    console.print(f"ROCm variables: {report.rocm_env or 'none'}", markup=False)
    console.print(f"CPU runs: {report.cpu_threads}", markup=False)
    console.print(f"extras: {describe_extras(report.extras)}", markup=False, highlight=False)
    console.print(
        f"HF_HOME: {report.hf_home} ({report.hf_home_free_gib or 0:.0f} GiB free)", markup=False
    )
    for warning in report.warnings:
        console.print(f"[yellow]• {warning}[/yellow]")
