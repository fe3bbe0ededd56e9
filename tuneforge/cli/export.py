"""`tuneforge export ...`: merged Hugging Face checkpoints and GGUF files."""

from pathlib import Path
from typing import Annotated

import typer

from tuneforge.cli.common import console

export_app = typer.Typer(help="Merge adapters and write GGUF files.", no_args_is_help=True)

SourceArg = Annotated[
    Path | None,
    typer.Argument(help="A run directory, an adapter directory or a model directory."),
]
BaseOption = Annotated[Path | None, typer.Option(help="Base model directory (with --adapter).")]
AdapterOption = Annotated[Path | None, typer.Option(help="Adapter directory (PEFT layout).")]
OverwriteOption = Annotated[bool, typer.Option(help="Replace an existing output.")]


@export_app.command("merge")
def merge(
    out: Annotated[Path, typer.Option(help="Output directory.")],
    source: SourceArg = None,
    base: BaseOption = None,
    adapter: AdapterOption = None,
    dtype: Annotated[
        str | None, typer.Option(help="bfloat16, float16 or float32 (default: the base's).")
    ] = None,
    overwrite: OverwriteOption = False,
) -> None:
    """Fold an adapter into its base: sharded safetensors, config, tokenizer, generation config."""
    from tuneforge.api.exporting import export_merge

    written = export_merge(
        source, out, base=base, adapter=adapter, dtype=dtype, overwrite=overwrite
    )
    console.print(f"merged model written to {written}", markup=False, highlight=False)


@export_app.command("gguf")
def gguf(
    out: Annotated[Path, typer.Option(help="Output .gguf file.")],
    source: SourceArg = None,
    model: Annotated[Path | None, typer.Option(help="Model directory (or use SOURCE).")] = None,
    base: BaseOption = None,
    adapter: AdapterOption = None,
    type: Annotated[
        str,
        typer.Option(
            # "\\[": rich would read [llamacpp] as markup and drop it
            help="Tensor type: f16 or q8_0 (the gguf package), q4_k_m, q5_k_m or q6_k "
            "(llama.cpp's quantiser: pip install 'tuneforge\\[llamacpp]').",
        ),
    ] = "f16",
    overwrite: OverwriteOption = False,
) -> None:
    """Write a GGUF file for llama.cpp, tokenizer and chat template included."""
    from tuneforge.api.exporting import export_gguf
    from tuneforge.export.sources import ExportError

    if model is not None and source is not None:
        raise ExportError("give SOURCE or --model, not both")
    written = export_gguf(
        source or model, out, quant=type, base=base, adapter=adapter, overwrite=overwrite
    )
    console.print(f"GGUF written to {written}", markup=False, highlight=False)
