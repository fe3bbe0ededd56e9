"""`tuneforge plot`, `tuneforge generate` and `tuneforge chat`: what to do with finished runs."""

from pathlib import Path
from typing import Annotated, Any

import typer

from tuneforge.cli.common import console


def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    out: Annotated[Path, typer.Option(help="Image file to write (.png, .svg, .pdf).")],
) -> None:
    """Loss, throughput and memory curves of runs side by side."""
    from tuneforge.api.runs_and_data import plot as draw

    console.print(f"written {draw(run_dirs, out)}", markup=False, highlight=False)


RunDirArgument = Annotated[
    Path, typer.Argument(help="Run directory of a finished run, or a model directory.")
]
MaxNewTokensOption = Annotated[int, typer.Option(min=1, help="Longest reply.")]
TemperatureOption = Annotated[float, typer.Option(min=0.0, help="0 for greedy decoding.")]
TopPOption = Annotated[
    float,
    typer.Option(
        min=0.01,
        max=1.0,
        help="Sample from the likeliest tokens holding this much probability (nucleus "
        "sampling; 1 keeps all).",
    ),
]
TopKOption = Annotated[
    int, typer.Option(min=0, help="Sample from the k likeliest tokens (0 keeps all).")
]
SeedOption = Annotated[int, typer.Option(help="Seed for sampling.")]
"""Options `generate` and `chat` share."""


def generate(
    run_dir: RunDirArgument,
    prompt: Annotated[
        str | None, typer.Option("--prompt", "-p", help="User message to answer.")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="A .jsonl of prompts ({prompt} or {messages}) to answer, all of them."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="With --data: the .jsonl to write (openai messages).")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts answered at once.")] = 32,
    max_new_tokens: MaxNewTokensOption = 64,
    temperature: TemperatureOption = 0.0,
    top_p: TopPOption = 1.0,
    top_k: TopKOption = 0,
    seed: SeedOption = 0,
) -> None:
    """Answer a prompt, or a whole file of prompts (an SFT dataset of the replies: sequence-level
    distillation), with a trained run (base + adapter, or full weights) or a model directory."""
    from tuneforge.api.generation import generate as answer
    from tuneforge.api.generation import generate_dataset
    from tuneforge.errors import TuneforgeError

    if not run_dir.is_dir():  # before the heavy imports
        raise TuneforgeError(f"{run_dir}: no such run or model directory")
    if (prompt is None) == (data is None):
        raise TuneforgeError("give --prompt TEXT or --data FILE (with --out FILE)")
    sampling: dict[str, Any] = {
        "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
        "top_k": top_k, "seed": seed, "batch_size": batch_size,
    }  # fmt: skip
    if prompt is not None:
        if not prompt.strip():
            raise TuneforgeError("--prompt is empty: give the user message to answer")
        (reply,) = answer(run_dir, prompt, **sampling)
        console.print(reply, markup=False, highlight=False)
        return
    if out is None:
        raise TuneforgeError("--data needs --out: the .jsonl to write the replies to")
    from rich.progress import Progress

    assert data is not None  # one of --prompt and --data, checked above
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("answering", total=None)
        written = generate_dataset(
            run_dir, data, out, overwrite=overwrite,
            advance=lambda n: progress.advance(task, n), **sampling,
        )  # fmt: skip
    console.print(f"{written} replies written to {out}", markup=False, highlight=False)


def chat(
    run_dir: RunDirArgument,
    system: Annotated[str | None, typer.Option(help="A system message to start with.")] = None,
    max_new_tokens: MaxNewTokensOption = 256,
    temperature: TemperatureOption = 0.0,
    top_p: TopPOption = 1.0,
    top_k: TopKOption = 0,
    seed: SeedOption = 0,
) -> None:
    """Chat with a trained run in the terminal: multi-turn, with its chat template, the reply
    streamed as it is written (/reset starts over, /exit or end of input leaves)."""
    import sys

    from tuneforge.errors import TuneforgeError

    if not run_dir.is_dir():  # before the heavy imports
        raise TuneforgeError(f"{run_dir}: no such run or model directory")
    from tuneforge.hardware.gpus import pick_device
    from tuneforge.inference.chat import COMMANDS
    from tuneforge.inference.chat import chat as converse
    from tuneforge.inference.trained import load_trained

    interactive = sys.stdin.isatty()
    if interactive:
        console.print(f"loading {run_dir} ...", markup=False, highlight=False)
    model, tokenizer = load_trained(run_dir, pick_device())
    if interactive:
        console.print(f"ready ({COMMANDS})", markup=False, highlight=False)

    def lines():
        if interactive:
            import readline  # noqa: F401  (line editing and history for input())
        while True:
            try:
                line = input("you> ") if interactive else sys.stdin.readline()
            except EOFError:
                return
            if not (interactive or line):
                return
            yield line

    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}
    prefix = "model> " if interactive else ""
    converse(model, tokenizer, lines(), show, system, max_new_tokens, sampling, prefix)
