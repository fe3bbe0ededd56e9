"""Everything the loop needs from the data section: packed training micro-batches, held-out
batches and the held-out conversations (for accuracy)."""

import logging
from dataclasses import dataclass, field

from tuneforge.config.schema import DataSection, DataSource
from tuneforge.data.cache import cached_examples, default_cache_dir
from tuneforge.data.dataset import DatasetStats, build_examples
from tuneforge.data.packing import PackedBatch, PackedLoader
from tuneforge.data.reading import read_conversations
from tuneforge.data.records import Conversation
from tuneforge.data.splits import check_disjoint_files, split_off

log = logging.getLogger(__name__)


@dataclass
class TrainingData:
    loader: PackedLoader
    stats: DatasetStats
    eval_batches: list[PackedBatch] = field(default_factory=list)
    eval_conversations: list[Conversation] = field(default_factory=list)


def read_sources(sources: list[DataSource], on_bad_record: str) -> list[Conversation]:
    conversations: list[Conversation] = []
    for source in sources:
        found, _ = read_conversations(source.path, source.format, source.field_map, on_bad_record)
        conversations += found
    return conversations


def load_training_data(
    data: DataSection, tokenizer, tokens_per_micro_batch: int, seed: int
) -> TrainingData:
    """Read, validate, split, tokenise (through the cache) and pack; raises `DataError`."""
    held_out: list[Conversation] = []
    kept: list[Conversation] = []
    if data.eval_fraction is not None:
        kept, held_out = split_off(
            read_sources(data.train, data.on_bad_record), data.eval_fraction, seed
        )
    elif data.eval:
        check_disjoint_files([s.path for s in data.train], [s.path for s in data.eval])

    def tokenise(conversations: list[Conversation]):
        return build_examples(
            conversations, tokenizer, data.max_seq_len, data.on_too_long, data.train_on
        )

    options = {
        "max_seq_len": data.max_seq_len,
        "on_too_long": data.on_too_long,
        "train_on": data.train_on,
        "on_bad_record": data.on_bad_record,
        "eval_fraction": data.eval_fraction,
        "seed": seed if data.eval_fraction is not None else None,
    }
    examples, stats = cached_examples(
        [(s.path, s.format, s.field_map) for s in data.train],
        tokenizer,
        options,
        (data.cache_dir or default_cache_dir()) if data.cache else None,
        lambda: tokenise(
            kept if data.eval_fraction is not None else read_sources(data.train, data.on_bad_record)
        ),
    )
    result = TrainingData(PackedLoader(examples, tokens_per_micro_batch, seed, data.packing), stats)
    if data.eval or held_out:
        result.eval_conversations = held_out or read_sources(data.eval, data.on_bad_record)
        eval_examples, _ = tokenise(result.eval_conversations)
        result.eval_batches = PackedLoader(eval_examples, tokens_per_micro_batch, 0).fixed_batches()
    log.info(
        "train data: %d records, %d tokens (%d carry loss), %d micro-batches per epoch",
        stats.num_records,
        stats.num_tokens,
        stats.num_loss_tokens,
        len(result.loader),
    )
    return result
