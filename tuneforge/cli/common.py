"""What every command shares: the consoles, the config arguments, logging and exit codes."""

import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

EXIT_USAGE = 2
EXIT_NONFINITE = 3

console = Console()
error_console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="Run configuration (YAML).")]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. train.lr=2e-4 lora.rank=32.")
]


def setup_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    if os.environ.get("RANK", "0") != "0":  # under torchrun the first rank speaks for all
        level = logging.WARNING
    logging.basicConfig(
        level=level,
        format="%(message)s",
        handlers=[RichHandler(console=error_console, show_path=False, show_time=False)],
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
