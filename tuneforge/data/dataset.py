"""From configured sources to training examples, with counts of what was kept and dropped."""

import logging
from dataclasses import dataclass, field

from tuneforge.config.schema import DataSection
from tuneforge.data.parallel import tokenize_all, worker_count
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.token_store import IGNORE_INDEX, Example, make_example

log = logging.getLogger(__name__)


@dataclass
class DatasetStats:
    num_records: int = 0
    num_dropped_too_long: int = 0
    num_truncated: int = 0
    num_split: int = 0
    """Records longer than max_seq_len cut into pieces (data.split_long)."""
    num_without_targets: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    dropped_examples: list[str] = field(default_factory=list)
    raw_lengths: list[int] = field(default_factory=list)
    """Tokenised length of every record before truncation or dropping."""


def split_example(example: Example, piece_length: int) -> list[Example]:
    """Consecutive pieces of at most `piece_length` tokens. Each keeps its labels, so the last
    token of a piece still predicts the first token of the next one."""
    return [
        Example(
            example.input_ids[start : start + piece_length],
            example.labels[start : start + piece_length],
        )
        for start in range(0, len(example.input_ids), piece_length)
    ]


def build_examples(
    conversations: list[Conversation],
    tokenizer,
    max_seq_len: int,
    on_too_long: str,
    train_on: str,
    *,
    split_long: bool = False,
    workers: int | None = 0,
) -> tuple[list[Example], DatasetStats]:
    """Tokenise (on `workers` processes, see `parallel.worker_count`), apply the length policy
    and drop records without supervised tokens, counting each."""
    stats = DatasetStats()
    examples: list[Example] = []
    tokenized_all = tokenize_all(
        tokenizer, conversations, train_on, worker_count(workers, len(conversations))
    )
    for conversation, tokenized in zip(conversations, tokenized_all, strict=True):
        stats.num_records += 1
        ids, mask = tokenized.input_ids, tokenized.loss_mask
        stats.raw_lengths.append(len(ids))
        if len(ids) > max_seq_len and split_long:
            pieces = [
                piece
                for piece in split_example(make_example(ids, mask), max_seq_len)
                if any(label != IGNORE_INDEX for label in piece.labels)
            ]
            stats.num_split += 1
            if not pieces:
                stats.num_without_targets += 1
                continue
            stats.num_tokens += sum(len(piece.input_ids) for piece in pieces)
            stats.num_loss_tokens += sum(
                label != IGNORE_INDEX for piece in pieces for label in piece.labels
            )
            examples += pieces
            continue
        if len(ids) > max_seq_len:
            if on_too_long == "error":
                raise DataError(
                    f"{conversation.origin}: {len(ids)} tokens exceed data.max_seq_len={max_seq_len}; "
                    "raise it, or set data.on_too_long to truncate or drop"
                )
            if on_too_long == "drop":
                stats.num_dropped_too_long += 1
                continue
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            stats.num_truncated += 1
        example = make_example(ids, mask)
        num_targets = sum(mask[1:])
        if num_targets == 0:
            stats.num_without_targets += 1
            if len(stats.dropped_examples) < 5:
                stats.dropped_examples.append(conversation.origin)
            continue
        stats.num_tokens += len(ids)
        stats.num_loss_tokens += num_targets
        examples.append(example)
    if not examples:
        raise DataError(
            f"no trainable examples among {stats.num_records} records: "
            f"{stats.num_dropped_too_long} too long, {stats.num_without_targets} without loss tokens"
        )
    if stats.num_without_targets:
        log.warning(
            "%d record(s) have no tokens that carry loss and were skipped (first: %s)",
            stats.num_without_targets,
            ", ".join(stats.dropped_examples),
        )
    return examples, stats


def examples_for(conversations: list[Conversation], tokenizer, data: DataSection):
    """`build_examples` with the length, masking and worker settings of a data section."""
    return build_examples(
        conversations,
        tokenizer,
        data.max_seq_len,
        data.on_too_long,
        data.train_on,
        split_long=data.split_long,
        workers=data.tokenize_workers,
    )
