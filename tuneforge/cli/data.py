"""`tuneforge data ...`: look at a dataset before training on it."""

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tuneforge.cli.common import EXIT_USAGE, console, error_console
from tuneforge.config import load_config
from tuneforge.errors import TuneforgeError

data_app = typer.Typer(help="Inspect and preview training data.", no_args_is_help=True)


def _from_config(config_file: Path, overrides: list[str]):
    from tuneforge.train.build import load_tokenizer

    config = load_config(config_file, overrides)
    return config, load_tokenizer(config)


@data_app.command("inspect")
def inspect(
    config: Annotated[Path | None, typer.Argument(help="Run configuration (YAML).")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="Dotted overrides.")] = None,
    data: Annotated[
        Path | None, typer.Option(help="A data file (instead of a configuration).")
    ] = None,
    format: Annotated[str, typer.Option(help="Record format of --data.")] = "openai",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Tokenizer directory for --data (the lengths depend on it); `demo`: the bundled one."
        ),
    ] = None,
    max_seq_len: Annotated[int, typer.Option(min=8, help="Length limit for --data.")] = 2048,
    tokens_per_micro_batch: Annotated[
        int, typer.Option(min=8, help="Packing budget for --data.")
    ] = 4096,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Records, lengths, supervision, packing efficiency and advice for a dataset."""
    if config is not None:
        loaded = load_config(config, overrides or [])  # its mistakes before the heavy imports
        from tuneforge.api.runs_and_data import inspect_data as report_of

        report = report_of(loaded)
    elif data is not None:
        if not data.exists():
            raise TuneforgeError(f"--data {data}: no such file or directory")
        section = _data_section(data, format, max_seq_len)
        from tuneforge.data.report import inspect_data

        sampling = format == "prompt"  # prompts alone are for an objective that samples
        report = inspect_data(
            section, _tokenizer(tokenizer), tokens_per_micro_batch, keep_fields=sampling
        )
    else:
        raise TuneforgeError("give a configuration, or --data FILE --format NAME")
    if as_json:
        console.print(
            json.dumps(report.as_dict(), indent=2), markup=False, highlight=False, soft_wrap=True
        )
        return
    table = Table("", "value", show_header=False)
    table.add_row(
        "records (kept / bad)", f"{report.records:,} ({report.kept:,} / {report.bad_records:,})"
    )
    table.add_row("tokens (supervised)", f"{report.tokens:,} ({report.supervised_fraction:.1%})")
    table.add_row("records without supervised tokens", f"{report.without_supervised_tokens:,}")
    percentiles = "  ".join(f"{k} {v:,}" for k, v in report.length_percentiles.items())
    table.add_row("length", f"{percentiles}  max {report.max_length:,}")
    table.add_row(
        f"truncated / dropped / split at {report.max_seq_len}",
        f"{report.truncated:,} / {report.dropped_too_long:,} / {report.split:,}",
    )
    table.add_row(
        f"packing efficiency at {report.tokens_per_micro_batch:,} tokens",
        f"{report.packing_efficiency:.1%}",
    )
    table.add_row("padding waste without packing", f"{report.padding_waste:.1%}")
    table.add_row("suggested max_seq_len (p99)", f"{report.suggested_max_seq_len:,}")
    console.print(table)
    for line in report.advice:
        console.print(f"• {line}", markup=False, highlight=False)


def _data_section(data: Path, format_name: str, max_seq_len: int):
    """The data section `inspect --data` stands for; bad values exit like a bad config."""
    from pydantic import ValidationError

    from tuneforge.config.sections.data import DataSection

    try:
        return DataSection.model_validate(
            {"train": [{"path": data, "format": format_name}], "max_seq_len": max_seq_len}
        )
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][-1:])}: {e['msg']}" for e in error.errors()
        )
        raise TuneforgeError(f"--data/--format/--max-seq-len: {problems}") from None


def _tokenizer(directory: Path | None):
    """The tokenizer `inspect --data` measures with: named, never assumed."""
    from transformers import AutoTokenizer

    from tuneforge.assets import DEMO_TOKENIZER_DIR

    if directory is None:
        raise TuneforgeError(
            "--data needs --tokenizer DIR (the model's tokenizer directory: lengths and "
            "packing depend on it; `--tokenizer demo` for the bundled demo tokenizer)"
        )
    if str(directory) == "demo" and not directory.exists():
        directory = DEMO_TOKENIZER_DIR
    if not (directory / "tokenizer.json").is_file():
        raise TuneforgeError(f"--tokenizer {directory}: no tokenizer.json there")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


@data_app.command("preview")
def preview(
    config: Annotated[Path, typer.Argument(help="Run configuration (YAML).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Dotted overrides.")] = None,
    num: Annotated[int, typer.Option("-n", min=1, help="How many records of each source.")] = 3,
) -> None:
    """Rendered records with the tokens that carry loss highlighted (green, between ⟦ ⟧). A
    record the chat template cannot render is named with the reason (exit code 2)."""
    from tuneforge.data.chat import Rendering
    from tuneforge.data.reading import read_source
    from tuneforge.data.records import DataError
    from tuneforge.data.report import preview_segments

    run_config, tok = _from_config(config, overrides or [])
    rendering = Rendering.of(run_config.data)
    conversations = []
    for source in run_config.data.train:  # the first records of every source
        found, _ = read_source(source, run_config.data.on_bad_record)
        conversations += found[:num]
    failed = 0
    for conversation in conversations:
        if len(conversation.origin) + 4 <= console.width:
            console.rule(conversation.origin)
        else:  # a rule would cut the path, and the line number with it
            console.print(
                f"── {conversation.origin}", soft_wrap=True, markup=False, highlight=False
            )
        try:
            segments = preview_segments(tok, conversation, rendering)
        except DataError as error:
            failed += 1
            error_console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
            continue
        text = Text()
        for segment, trained in segments:
            text.append(
                f"⟦{segment}⟧" if trained else segment, style="bold green" if trained else "dim"
            )
        console.print(text)
    if failed:
        raise typer.Exit(EXIT_USAGE)
