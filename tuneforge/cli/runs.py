"""`tuneforge plot` and `tuneforge generate`: what to do with finished runs."""

from pathlib import Path
from typing import Annotated

import typer

from tuneforge.cli.common import console


def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="One or more run directories.")],
    out: Annotated[Path, typer.Option(help="Image file to write (.png, .svg, .pdf).")],
) -> None:
    """Loss, throughput and memory curves of runs side by side."""
    from tuneforge.runs.plot import plot_runs

    console.print(f"written {plot_runs(run_dirs, out)}", markup=False, highlight=False)


def generate(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of a finished training run.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="User message to answer.")],
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Longest reply.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
) -> None:
    """Answer a prompt with a trained run (base + adapter, or full weights)."""
    import torch

    from tuneforge.hardware.gpus import pick_device
    from tuneforge.inference.trained import load_trained
    from tuneforge.models.generate import generate as generate_tokens

    model, tokenizer = load_trained(run_dir, pick_device())
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stop = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    reply = generate_tokens(model, [ids], max_new_tokens, stop, temperature, generator)[0]
    console.print(tokenizer.decode(reply, skip_special_tokens=True), markup=False, highlight=False)
