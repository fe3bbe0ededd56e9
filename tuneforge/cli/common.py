"""What every command shares: the consoles, the config arguments, logging and exit codes."""

import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.measure import Measurement
from rich.table import Table

EXIT_USAGE = 2
EXIT_NONFINITE = 3
UNBOUNDED_WIDTH = 10_000
"""Columns a table may take where nothing bounds them (a pipe, a file)."""

console = Console()
error_console = Console(stderr=True)


def print_table(table: Table) -> None:
    """`table` whole: into a pipe or a file (no terminal's width to keep to) it is printed as
    wide as its cells are, not squeezed into 80 columns of "…"."""
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), table)
    Console(width=max(natural.maximum, console.width)).print(table)


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
