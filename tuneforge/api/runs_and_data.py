"""The smaller commands as functions: `plot` (curves of runs), `inspect_data` (a dataset's
report), `catalog` (the model shapes), `doctor_env` (this machine), `slurm_chain` (a chain of
SLURM jobs that resume one run, queued and followed)."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge.api.configuration import ConfigLike, config
from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:
    from tuneforge.data.report import DataReport
    from tuneforge.doctor.env import EnvReport
    from tuneforge.models.args import ModelArgs
    from tuneforge.slurm.status import ChainStatus


def plot(runs: Sequence[str | Path], out: str | Path) -> Path:
    """Loss, throughput and memory curves of runs side by side, drawn into `out` (.png, .svg,
    .pdf); returns the file written."""
    from tuneforge.runs.plot import plot_runs

    return plot_runs([Path(run) for run in runs], Path(out))


def inspect_data(source: ConfigLike) -> "DataReport":
    """The training data of a configuration as the run reads it: records, lengths, supervision,
    packing efficiency, padding waste, advice."""
    from tuneforge.config.objectives.registry import declaration_of
    from tuneforge.data.report import inspect_data as report_of
    from tuneforge.train.build import load_tokenizer

    loaded = config(source)
    train = loaded.train
    sampling = declaration_of(loaded).keeps_record_fields
    return report_of(
        loaded.data, load_tokenizer(loaded), train.tokens_per_micro_batch, train.seed, sampling
    )


def catalog() -> "dict[str, ModelArgs]":
    """The catalog of model shapes (`model.name`), each buildable with random weights."""
    from tuneforge.models.catalog import CATALOG

    return dict(CATALOG)


def doctor_env() -> "EnvReport":
    """This machine: GPUs, versions, the allocator setting in effect, attention kernels,
    NCCL/RCCL and ROCm variables, CPU threads, extras, the Hugging Face cache, warnings."""
    from tuneforge.doctor.env import inspect_environment

    return inspect_environment()


def slurm_chain(
    config_file: str | Path,
    *overrides: str,
    jobs: int = 1,
    time: str,
    nodes: int = 1,
    gpus_per_node: int = 0,
    procs_per_node: int | None = None,
    partition: str | None = None,
    account: str | None = None,
    env: Mapping[str, str] | None = None,
    out: str | Path | None = None,
) -> tuple[Path, Path]:
    """Write the sbatch script of a chain of `jobs` SLURM jobs, each of `time` (HH:MM:SS, 4h),
    that run `tuneforge train CONFIG_FILE OVERRIDES` and resume one another, and the script that
    queues them; returns (sbatch script, submit script). The jobs read the configuration file
    again, so it is named by its file."""
    from tuneforge.config.durations import parse_duration
    from tuneforge.slurm.chain import ChainSpec, write_chain

    try:
        parse_duration(time)
    except ValueError as error:
        raise TuneforgeError(f"--time: {error}") from None
    if jobs < 1:
        raise TuneforgeError("--jobs must be at least 1")
    loaded = config(config_file, *overrides)
    spec = ChainSpec(
        Path(config_file), list(overrides), jobs, time, nodes, gpus_per_node, partition, account,
        dict(env or {}), procs_per_node=procs_per_node,
    )  # fmt: skip
    directory = Path(out) if out is not None else Path(loaded.run.directory) / "slurm"
    return write_chain(spec, loaded, directory)


def slurm_submit(directory: str | Path) -> list[str]:
    """Queue the chain written in `directory` (sbatch, each job after the one before); returns
    the job ids."""
    import subprocess

    from tuneforge.slurm.chain import SUBMIT

    script = Path(directory) / SUBMIT
    if not script.is_file():
        raise TuneforgeError(
            f"{directory} has no {SUBMIT}: write the chain first (tuneforge slurm CONFIG ...)"
        )
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if result.returncode != 0:
        raise TuneforgeError(f"sbatch failed: {result.stderr.strip()}")
    return result.stdout.split()


def slurm_status(run_dir: str | Path) -> "ChainStatus":
    """Where a chain's run is: steps done, its state, the jobs it used, tokens/s and ETA."""
    from tuneforge.slurm.status import chain_status

    if not Path(run_dir).is_dir():  # writing the chain makes it: a name mistyped
        raise TuneforgeError(f"{run_dir}: no such run directory")
    return chain_status(Path(run_dir))
