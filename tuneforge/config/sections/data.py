"""`data:` the training and held-out sources and how they become documents."""

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tuneforge.config.hub import HubName
from tuneforge.config.sections.base import InputPath, Section


class DataSource(Section):
    path: InputPath | None = None
    """A `.jsonl`, `.json` (a list) or `.parquet` file, a directory or glob of them, a dataset saved
    with `datasets.save_to_disk`, or (format mlperf) a packed `.npy`; with `hub`, the snapshot it
    resolved to."""
    hub: Annotated[str, HubName("dataset")] | None = None
    """Instead of path: a hub dataset id (`rajpurkar/squad`), resolved through the Hugging Face
    cache (downloaded there unless HF_HUB_OFFLINE is set) and read with `datasets`."""
    split: str = "train"
    """With hub: the split to read."""
    subset: str | None = None
    """With hub: the subset (configuration) to read, where the dataset has several."""
    revision: str | None = None
    """With hub: the branch, tag or commit; the run records the commit."""
    format: Literal[
        "openai",
        "messages",
        "alpaca",
        "squad",
        "sharegpt",
        "text",
        "preference",
        "unpaired",
        "prompt",
        "mlperf",
    ] = "openai"
    """Record format: openai/messages, alpaca, squad, sharegpt, text (every token trained),
    preference (prompt, chosen, rejected), unpaired (prompt, completion, label: true for a reply
    to learn, false for one to avoid; KTO's), prompt (a prompt alone, answered by GRPO's
    sampling), or mlperf (pre-tokenised packs: input_ids, loss_mask, seq_start_id)."""
    weight: float = Field(1.0, gt=0)
    """Share of this source in the mix: 2 repeats each record twice per epoch, 0.5 keeps a seeded
    half."""
    field_map: dict[str, str] = {}
    """Rename fields: the format's field name -> the name in the file (e.g. {output: response})."""
    metadata: InputPath | None = None
    """Format mlperf: the packing metadata JSON written with the `.npy` (pack_size,
    max_samples_per_bin, ...); the data is checked against it."""

    @property
    def files(self) -> Path:
        """Where the source's files are: its path, or the hub snapshot it resolved to."""
        assert self.path is not None, "a hub source's path is its snapshot, set when loaded"
        return self.path

    @model_validator(mode="after")
    def _a_path_or_a_hub_id(self) -> "DataSource":
        if self.path is None and self.hub is None:  # (a hub id's snapshot becomes its path)
            raise ValueError("give a data source a path or a hub dataset id (hub)")
        return self


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1)
    """Training sources."""
    eval: list[DataSource] = []
    """Held-out sources for evaluation loss and accuracy; empty disables evaluation."""
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    """Instead of data.eval: hold out this seeded fraction of the training records."""
    max_seq_len: int = Field(2048, ge=8)
    """Longest tokenised conversation kept; longer ones are handled by `on_too_long`."""
    on_too_long: Literal["truncate", "drop", "error"] = "drop"
    """What to do with a conversation longer than max_seq_len (unless data.split_long)."""
    cache_dir: Path | None = None
    """Where tokenised data is cached (default ~/.cache/tuneforge/tokenized); see data.cache."""
    cache: bool = True
    """Cache tokenised data, keyed by the contents of sources, tokenizer, template, options and
    the code that builds the documents."""
    packing: Literal["ffd", "bfd", "none"] = "ffd"
    """How documents fill micro-batches: packed first-fit or best-fit decreasing, or `none` (padded
    to the longest, for comparison)."""
    balance_ranks: bool = False
    """With several data-parallel ranks, give each step's ranks micro-batches of similar attention
    work (the sum of their documents' squared lengths): a step waits for its slowest rank. Within
    windows of 8 steps micro-batches are sorted by it and dealt in neighbouring groups, the groups'
    order shuffled. Off: each rank takes every world_size-th micro-batch of the shuffled order."""
    split_long: bool = False
    """Cut documents longer than max_seq_len into max_seq_len pieces (each attends only within
    itself) instead of applying on_too_long."""
    tokenize_workers: int | None = Field(None, ge=0)
    """Processes that render and tokenise records; 0 tokenises in this process; unset: one per CPU
    (at most 8) for large datasets."""
    on_bad_record: Literal["error", "skip"] = "error"
    """A malformed record stops the run (`error`, listing file, line and reason) or is left out
    (`skip`, counted)."""
    train_on: Literal["assistant", "last_assistant", "all"] = "assistant"
    """Tokens that carry loss: every assistant reply (with its end-of-turn token, not the whitespace
    after it), only the last one, or all."""
    empty_think: Literal["train", "mask"] = "train"
    """The empty `<think></think>` block a template writes before a reply without reasoning
    (Qwen3's, on the last reply): trained as part of the reply (the model learns to answer without
    thinking), or masked (seen, not trained)."""
    date_string: str | None = "26 Jul 2024"
    """The date chat templates that stamp today's date write (Llama 3.x: `Today Date:`), so that a
    run's tokens do not depend on the day they are made; null lets the template write today's."""
