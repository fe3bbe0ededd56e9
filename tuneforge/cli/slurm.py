"""`tuneforge slurm CONFIG ...` writes a job chain; `slurm submit DIR` queues it; `slurm status
RUN_DIR` reports on it."""

from pathlib import Path
from typing import Annotated

import typer

from tuneforge.cli.common import console
from tuneforge.errors import TuneforgeError


def slurm_command(
    args: Annotated[
        list[str],
        typer.Argument(
            help="CONFIG \\[key=value ...] to write a chain; submit DIR; status RUN_DIR."
        ),
    ],
    jobs: Annotated[int, typer.Option(min=1, help="Jobs in the chain.")] = 1,
    time: Annotated[str | None, typer.Option(help="Time limit of each job (HH:MM:SS).")] = None,
    nodes: Annotated[int, typer.Option(min=1, help="Nodes per job.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(min=0, help="GPUs per node (0: CPU).")] = 0,
    procs_per_node: Annotated[
        int | None,
        typer.Option(min=1, help="Training processes per node (default: one per GPU, or one)."),
    ] = None,
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    account: Annotated[str | None, typer.Option(help="SLURM account.")] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE exported by the job (repeatable).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Where to write the scripts (default: RUN_DIR/slurm).")
    ] = None,
) -> None:
    """Write (and submit, and follow) a chain of SLURM jobs that resume one run."""
    if args[0] == "submit":
        _submit(_one(args, "submit DIR"))
    elif args[0] == "status":
        _status(_one(args, "status RUN_DIR"))
    else:
        _write(
            Path(args[0]),
            args[1:],
            jobs,
            time,
            nodes,
            gpus_per_node,
            partition,
            account,
            env or [],
            out,
            procs_per_node,
        )


def _one(args: list[str], usage: str) -> Path:
    if len(args) != 2:
        raise TuneforgeError(f"usage: tuneforge slurm {usage}")
    return Path(args[1])


def _write(
    config_file,
    overrides,
    jobs,
    time,
    nodes,
    gpus_per_node,
    partition,
    account,
    env,
    out,
    procs_per_node=None,
) -> None:
    from tuneforge.api.runs_and_data import slurm_chain

    if time is None:
        raise TuneforgeError("--time is required: the time limit of each job (e.g. 38:00:00)")
    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TuneforgeError(f"--env {item!r}: use KEY=VALUE")
        pairs[key] = value
    script, submit = slurm_chain(
        config_file, *overrides, jobs=jobs, time=time, nodes=nodes, gpus_per_node=gpus_per_node,
        procs_per_node=procs_per_node, partition=partition, account=account, env=pairs, out=out,
    )  # fmt: skip
    console.print(
        f"wrote {script} and {submit}; queue the chain with: tuneforge slurm submit {submit.parent}",
        markup=False,
    )


def _submit(directory: Path) -> None:
    from tuneforge.api.runs_and_data import slurm_submit

    ids = slurm_submit(directory)
    console.print(f"queued {len(ids)} job(s): {' '.join(ids)}", markup=False)


def _status(run_dir: Path) -> None:
    from tuneforge.api.runs_and_data import slurm_status

    status = slurm_status(run_dir)
    total = f"/{status.total_steps}" if status.total_steps else ""
    progress = f"step {status.steps_done}{total}, " if status.state != "not started" else ""
    if status.state == "no step logged yet":
        progress = ""
    console.print(
        f"{run_dir}: {progress}{status.state}, {len(status.jobs)} job(s) used", markup=False
    )
    for job in status.jobs:
        console.print(
            f"  job {job['job']}: steps {job['first_step']} -> {job['last_step']} (exit {job['exit']})",
            markup=False,
        )
    if status.tokens_per_s is not None:
        eta = f", ETA {status.eta_s / 3600:.1f} h" if status.eta_s else ""
        console.print(f"  {status.tokens_per_s:,.0f} tokens/s{eta}", markup=False)
