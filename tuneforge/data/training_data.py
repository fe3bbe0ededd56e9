"""Everything the loop needs from the data section: packed training micro-batches, held-out
batches and the held-out conversations (for accuracy)."""

import logging
import random
from dataclasses import dataclass, field

from tuneforge.config.objectives.declaration import DataFormat
from tuneforge.config.sections.data import DataSection, DataSource
from tuneforge.data.cache import cached_examples, default_cache_dir
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import DatasetStats, examples_for, report_left_out
from tuneforge.data.packing import PackedBatch, PackedLoader
from tuneforge.data.pairs import pair_examples
from tuneforge.data.reading import read_source
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.splits import check_disjoint_files, split_off
from tuneforge.data.unpaired import unpaired_examples

log = logging.getLogger(__name__)

TWO_DOCUMENTS = {"pairs": pair_examples, "unpaired": unpaired_examples}
"""The formats whose records are two documents each, packed whole, and what makes them."""


@dataclass
class TrainingData:
    loader: PackedLoader
    stats: DatasetStats
    eval_batches: list[PackedBatch] = field(default_factory=list)
    eval_conversations: list[Conversation] = field(default_factory=list)


def read_sources(sources: list[DataSource], on_bad_record: str) -> list[list[Conversation]]:
    """The records of each source, in order."""
    return [read_source(source, on_bad_record)[0] for source in sources]


def apply_weight(conversations: list[Conversation], weight: float, seed: int) -> list[Conversation]:
    """`weight` copies of the records: whole repeats, then a seeded sample for the fraction."""
    whole, fraction = int(weight), weight - int(weight)
    count = round(len(conversations) * fraction)
    extra = random.Random(seed).sample(conversations, count) if count else []
    return conversations * whole + extra


def training_conversations(
    data: DataSection, seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    """(training mix, held-out): the held-out fraction is taken before weighting, so a repeated
    record can never be on both sides."""
    return mix_of(data, read_sources(data.train, data.on_bad_record), seed)


def mix_of(
    data: DataSection, per_source: list[list[Conversation]], seed: int
) -> tuple[list[Conversation], list[Conversation]]:
    """`training_conversations` of records already read, one list per source."""
    held_out: list[Conversation] = []
    if data.eval_fraction is not None:
        tagged = [(index, c) for index, found in enumerate(per_source) for c in found]
        kept, held = split_off(tagged, data.eval_fraction, seed)
        held_out = [c for _, c in held]
        per_source = [
            [c for index, c in kept if index == source] for source in range(len(per_source))
        ]
    mix = [
        c
        for index, (source, found) in enumerate(zip(data.train, per_source, strict=True))
        for c in apply_weight(found, source.weight, seed + index)
    ]
    return mix, held_out


def load_training_data(
    data: DataSection,
    tokenizer,
    tokens_per_micro_batch: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    data_format: DataFormat = "conversations",
    keep_fields: bool = False,
) -> TrainingData:
    """Read, validate, split, weight, tokenise (through the cache) and pack; raises `DataError`.
    The loader serves data-parallel rank `rank` of `world_size`. In the `pairs` format (the
    objective's) each record is a pair of documents, packed whole (`data/pairs.py`); in the
    `unpaired` format a labelled reply with its mismatched sample, packed the same way
    (`data/unpaired.py`). With `keep_fields` each document carries its record's other fields
    (`PackedBatch.record_fields`)."""
    pairs = data_format in TWO_DOCUMENTS
    split = training_conversations(data, seed) if data.eval_fraction is not None else None
    if data.eval and split is None:
        check_disjoint_files([s.files for s in data.train], [s.files for s in data.eval])

    rendering = Rendering.of(data)

    def tokenise(conversations: list[Conversation]):
        if pairs:
            units = TWO_DOCUMENTS[data_format]
            return units(conversations, tokenizer, data, rendering, tokens_per_micro_batch)
        return examples_for(conversations, tokenizer, data, rendering, keep_fields)

    options = {
        "max_seq_len": data.max_seq_len,
        "split_long": data.split_long,
        "on_too_long": data.on_too_long,
        "train_on": data.train_on,
        "empty_think": data.empty_think,
        "date_string": rendering.date_string,
        "on_bad_record": data.on_bad_record,
        "eval_fraction": data.eval_fraction,
        "weights": [s.weight for s in data.train],
        # the seed only picks records when a fraction is held out or a weight is fractional
        "seed": seed if data.eval_fraction or any(s.weight % 1 for s in data.train) else None,
    }
    if pairs:
        options |= {"data_format": data_format, "tokens_per_micro_batch": tokens_per_micro_batch}
    if keep_fields:
        options["record_fields"] = "with their origin"
    examples, stats = cached_examples(
        data.train,
        tokenizer,
        options,
        (data.cache_dir or default_cache_dir()) if data.cache else None,
        lambda: tokenise((split or training_conversations(data, seed))[0]),
    )
    report_left_out(stats, data.max_seq_len)
    held_out = split[1] if split is not None else []
    loader = PackedLoader(
        examples,
        tokens_per_micro_batch,
        seed,
        data.packing,
        rank,
        world_size,
        balance=data.balance_ranks,
        pairs=pairs,
    )
    result = TrainingData(loader, stats)
    if data.eval or held_out:
        try:
            result.eval_conversations = held_out or [
                c for found in read_sources(data.eval, data.on_bad_record) for c in found
            ]
            eval_examples, eval_stats = tokenise(result.eval_conversations)
            report_left_out(eval_stats, data.max_seq_len)
        except DataError as error:
            error.field = "data.eval" if data.eval else error.field
            raise
        result.eval_batches = PackedLoader(
            eval_examples, tokens_per_micro_batch, 0, data.packing, pairs=pairs
        ).fixed_batches()
    log.info(
        "train data: %d records (%d kept), %d tokens (%d carry loss), %d micro-batches per epoch",
        stats.num_records,
        stats.num_records - stats.num_left_out,
        stats.num_tokens,
        stats.num_loss_tokens,
        len(result.loader),
    )
    return result
