"""`tuneforge.generate(...)`: replies of a trained run (base + adapter, or full weights) or of a
model directory, to prompts given in Python or to a whole file of them (`generate_dataset`)."""

from collections.abc import Callable, Sequence
from pathlib import Path

from tuneforge.errors import TuneforgeError

Prompt = str | list[dict[str, str]]
"""A user message, or a conversation (`[{"role": ..., "content": ...}, ...]`) ending with one."""


def generate(
    run: str | Path,
    prompts: Prompt | Sequence[Prompt],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    batch_size: int = 32,
) -> list[str]:
    """The reply to each prompt, in order (one prompt: a list of one), through the model's chat
    template. `temperature` 0 decodes greedily; otherwise nucleus (`top_p`) and top-k sampling,
    each prompt with its own random stream of `seed`."""
    conversations = [_conversation(prompt) for prompt in _listed(prompts)]
    model, tokenizer = _loaded(run, max_new_tokens, temperature, top_p, top_k)
    from tuneforge.inference.replies import replies

    return list(
        replies(
            model, tokenizer, conversations, batch_size=batch_size,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p,
            top_k=top_k,
        )
    )  # fmt: skip


def generate_dataset(
    run: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    overwrite: bool = False,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    batch_size: int = 32,
    advance: Callable[[int], None] | None = None,
) -> int:
    """Answer every prompt of `data` (.jsonl of `{prompt}` or `{messages}`) and write the
    conversations to `out` as an SFT dataset (openai messages): sequence-level distillation.
    Returns the number written; `advance(n)` is told of each batch answered."""
    from tuneforge.inference.replies import read_prompts, write_replies

    out = Path(out)
    if out.exists() and not overwrite:
        raise TuneforgeError(f"--out {out} exists: choose another file, or add --overwrite")
    if not out.parent.is_dir():
        raise TuneforgeError(f"--out {out}: there is no directory {out.parent}")
    conversations = read_prompts(Path(data))  # before the model loads
    model, tokenizer = _loaded(run, max_new_tokens, temperature, top_p, top_k)
    return write_replies(
        model, tokenizer, conversations, out, batch_size=batch_size,
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, top_p=top_p,
        top_k=top_k, advance=advance or (lambda _: None),
    )  # fmt: skip


def _listed(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    listed = list(prompts)
    if listed and isinstance(listed[0], dict):  # one conversation
        return [listed]  # type: ignore[list-item]
    return listed  # type: ignore[return-value]


def _conversation(prompt: Prompt) -> list[dict[str, str]]:
    from tuneforge.inference.replies import prompt_messages

    record = {"prompt": prompt} if isinstance(prompt, str) else {"messages": prompt}
    try:
        return prompt_messages(record)
    except TuneforgeError as error:
        raise TuneforgeError(f"prompt {prompt!r}: {error}") from None


def _loaded(run: str | Path, max_new_tokens: int, temperature: float, top_p: float, top_k: int):
    if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise TuneforgeError(
            "sampling: max_new_tokens ≥ 1, temperature ≥ 0, top_p in (0, 1], top_k ≥ 0"
        )
    directory = Path(run)
    if not directory.is_dir():
        raise TuneforgeError(f"{directory}: no such run or model directory")
    from tuneforge.hardware.gpus import pick_device
    from tuneforge.inference.trained import load_trained

    return load_trained(directory, pick_device())
