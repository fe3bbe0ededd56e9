"""The `tuneforge` command line: parses arguments, calls the library, prints for humans."""

import sys

import typer

from tuneforge.cli.bench import bench_command
from tuneforge.cli.common import EXIT_USAGE, error_console
from tuneforge.cli.compare import compare
from tuneforge.cli.config import config_app, models
from tuneforge.cli.data import data_app
from tuneforge.cli.doctor import doctor_app
from tuneforge.cli.export import export_app
from tuneforge.cli.plan import plan_command
from tuneforge.cli.runs import chat, generate, plot
from tuneforge.cli.slurm import slurm_command
from tuneforge.cli.train import train
from tuneforge.config import ConfigError
from tuneforge.errors import TuneforgeError

app = typer.Typer(
    help="Fine-tune large language models, and know before launch whether the run fits.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(export_app, name="export")
app.add_typer(doctor_app, name="doctor")
app.command("models")(models)
app.command("train")(train)
app.command("plan")(plan_command)
app.command("slurm")(slurm_command)
app.command("bench")(bench_command)
app.command("plot")(plot)
app.command("compare")(compare)
app.command("generate")(generate)
app.command("chat")(chat)


def main() -> None:
    try:
        app()
    except ConfigError as error:
        error_console.print(str(error), markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)
    except TuneforgeError as error:
        error_console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_USAGE)
