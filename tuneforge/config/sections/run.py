"""`run:` the run's name and directory."""

from pathlib import Path

from pydantic import Field

from tuneforge.config.sections.base import Section


class RunSection(Section):
    name: str = Field("run", min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    """Run name: letters, digits, '.', '_' or '-'; names the run directory by default."""
    output_dir: Path | None = None
    """Run directory (config, metrics, checkpoints); default `runs/<run.name>`. Never put a job id
    in it."""
    env: dict[str, str] = {}
    """Environment the SLURM job scripts export (e.g. PYTORCH_ALLOC_CONF, NCCL_SOCKET_IFNAME,
    HF_HOME)."""

    @property
    def directory(self) -> Path:
        return self.output_dir if self.output_dir is not None else Path("runs") / self.name
