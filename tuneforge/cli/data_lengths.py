"""The training records' lengths for the planner's predictions, shared by `plan` and
`doctor oom --config`: both size memory from the same documents."""

from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge.cli.common import console
from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:
    from tuneforge.data.length_policy import RecordLengths


def record_lengths(config_file: Path, overrides: list[str]) -> "RecordLengths | None":
    """The training records' lengths and targets (through the cache), or None when unavailable."""
    from tuneforge.config import load_config
    from tuneforge.data.training_data import load_training_data
    from tuneforge.train.build import load_tokenizer

    config = load_config(config_file, overrides)
    try:
        tokenizer = load_tokenizer(config)
        data = load_training_data(
            config.data, tokenizer, config.train.tokens_per_micro_batch, config.train.seed
        )
    except TuneforgeError as error:
        console.print(
            f"[yellow]data not used ({error}); documents assumed max_seq_len long[/yellow]"
        )
        return None
    return data.stats.records
