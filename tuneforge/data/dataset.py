"""From configured sources to training examples, with counts of what was kept and dropped."""

import logging
from dataclasses import dataclass, field

from tuneforge.data.chat import tokenize_conversations
from tuneforge.data.packing import Example, make_example
from tuneforge.data.records import Conversation, DataError

log = logging.getLogger(__name__)


@dataclass
class DatasetStats:
    num_records: int = 0
    num_dropped_too_long: int = 0
    num_truncated: int = 0
    num_without_targets: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    dropped_examples: list[str] = field(default_factory=list)
    raw_lengths: list[int] = field(default_factory=list)
    """Tokenised length of every record before truncation or dropping."""


def build_examples(
    conversations: list[Conversation], tokenizer, max_seq_len: int, on_too_long: str, train_on: str
) -> tuple[list[Example], DatasetStats]:
    stats = DatasetStats()
    examples: list[Example] = []
    tokenized_all = tokenize_conversations(tokenizer, conversations, train_on)
    for conversation, tokenized in zip(conversations, tokenized_all, strict=True):
        stats.num_records += 1
        ids, mask = tokenized.input_ids, tokenized.loss_mask
        stats.raw_lengths.append(len(ids))
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
