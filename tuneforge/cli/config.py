"""`tuneforge config` and `tuneforge models`: configurations and the catalog of shapes."""

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from tuneforge.cli.common import ConfigArg, OverridesArg, console
from tuneforge.config import ConfigError, dump_config, load_config

config_app = typer.Typer(help="Inspect and check configurations.", no_args_is_help=True)


@config_app.command("show")
def config_show(config: ConfigArg, overrides: OverridesArg = None) -> None:
    """Print the resolved configuration (presets merged, overrides and defaults applied)."""
    from tuneforge.config.hub import without_weights

    with without_weights():
        loaded = load_config(config, overrides or [])
    console.print(dump_config(loaded), end="", markup=False, highlight=False)


@config_app.command("validate")
def config_validate(
    config: ConfigArg,
    overrides: OverridesArg = None,
    no_data: Annotated[
        bool, typer.Option(help="Skip the checks that read the tokenizer and the data files.")
    ] = False,
) -> None:
    """Check a configuration as `train` checks it before any weights load: its rules, then the
    preflight's checks (mesh sizes against the model's config.json, the tokenizer, the data,
    reward functions, this machine). Every problem is listed at once (exit code 2 if any)."""
    from tuneforge.api.configuration import validate
    from tuneforge.config.hub import without_weights

    with without_weights():  # its mistakes before the heavy imports
        loaded = load_config(config, overrides or [])
    try:
        checked = validate(loaded, with_data=not no_data)
    except ConfigError as error:  # named by the configuration file, as `train` names it
        raise ConfigError(error.issues, str(config)) from None
    if checked.machine_issues:
        for issue in checked.machine_issues:
            console.print(f"this machine: {issue}", style="red", markup=False)
        console.print(f"{config} is valid, but this machine cannot run it as it is")
        raise typer.Exit(2)
    console.print(f"[green]ok[/green]: {config} is valid")
    for advisory in checked.advisories:
        console.print(f"[yellow]note[/yellow]: {advisory}", highlight=False)


@config_app.command("fields")
def config_fields(
    markdown: Annotated[
        bool, typer.Option(help="Print the Markdown reference (docs/config.md).")
    ] = False,
) -> None:
    """List every configuration field with its type, default and help."""
    from tuneforge.config.help import field_rows, fields_markdown

    if markdown:
        console.print(fields_markdown(), end="", markup=False, highlight=False, soft_wrap=True)
        return
    table = Table("field", "type", "default", "help")
    for row in field_rows():
        table.add_row(*row)
    console.print(table)


def models() -> None:
    """List the catalog shapes (usable as model.name, e.g. for random-init proxies)."""
    from tuneforge.api.runs_and_data import catalog

    shapes = catalog()

    table = Table(
        "name",
        "layers",
        "dim",
        "heads/kv",
        "ffn",
        "experts",
        "params",
        "active",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),  # with the box's divider: two spaces between columns
    )
    table.columns[0].min_width = max(map(len, shapes))  # a name is what one copies
    for column in table.columns:  # fits 80 columns whole, never clipped
        column.no_wrap = True
    for name, args in shapes.items():
        experts = f"{args.moe.top_k}/{args.moe.num_experts}" if args.moe else "-"
        table.add_row(
            name,
            str(args.num_layers),
            str(args.dim),
            f"{args.num_heads}/{args.num_kv_heads}",
            str(args.moe.expert_ffn_dim if args.moe else args.ffn_dim),
            experts,
            _count(args.num_params()),
            _count(args.num_params(active=True)),
        )
    console.print(table)


def _count(parameters: int) -> str:
    from tuneforge.models.cost import parameter_count

    return parameter_count(parameters).replace(" ", "")
