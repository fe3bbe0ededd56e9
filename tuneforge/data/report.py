"""What `tuneforge data inspect` reports: lengths, supervision, packing efficiency, advice."""

import math
from dataclasses import asdict, dataclass

import numpy as np

from tuneforge.config.sections.data import DataSection
from tuneforge.data.bin_packing import first_fit_decreasing, padded_groups
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.token_store import Example

PERCENTILES = (50, 90, 99)
LENGTH_ROUNDING = 64


@dataclass
class DataReport:
    records: int
    kept: int
    bad_records: int
    tokens: int
    supervised_tokens: int
    supervised_fraction: float
    without_supervised_tokens: int
    truncated: int
    dropped_too_long: int
    split: int
    """Records longer than max_seq_len cut into pieces (data.split_long)."""
    length_percentiles: dict[str, int]
    max_length: int
    max_seq_len: int
    tokens_per_micro_batch: int
    packing_efficiency: float
    """Real tokens / (micro-batches x token budget) when packed."""
    padding_waste: float
    """Share of padding when each micro-batch is padded to its longest sequence (no packing)."""
    suggested_max_seq_len: int
    advice: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def padded_waste(lengths: list[int], budget: int, seed: int = 0) -> float:
    """Padding share of the micro-batches `data.packing: none` makes: documents in a seeded order,
    each micro-batch padded to its longest."""
    groups = padded_groups(lengths, budget, seed)
    padded = sum(max(lengths[i] for i in group) * len(group) for group in groups)
    return 1.0 - sum(lengths) / padded if padded else 0.0


def build_report(
    examples: list[Example],
    stats: DatasetStats,
    max_seq_len: int,
    tokens_per_micro_batch: int,
    bad_records: int = 0,
) -> DataReport:
    lengths = [len(example.input_ids) for example in examples]
    raw = np.array(stats.raw_lengths or lengths)
    percentiles = {f"p{p}": int(np.percentile(raw, p)) for p in PERCENTILES}
    bins = first_fit_decreasing(lengths, tokens_per_micro_batch)
    efficiency = sum(lengths) / (len(bins) * tokens_per_micro_batch)
    waste = padded_waste(lengths, tokens_per_micro_batch)
    suggested = max(
        LENGTH_ROUNDING, math.ceil(percentiles["p99"] / LENGTH_ROUNDING) * LENGTH_ROUNDING
    )
    advice = []
    if suggested < max_seq_len:
        advice.append(
            f"99% of records fit in {suggested} tokens: data.max_seq_len={suggested} is enough "
            f"(it is {max_seq_len}); with packing the saving is real, without it batches pad to the longest"
        )
    if stats.num_dropped_too_long or stats.num_truncated:
        advice.append(
            f"{stats.num_dropped_too_long} record(s) dropped and {stats.num_truncated} truncated at "
            f"data.max_seq_len={max_seq_len}; the longest has {int(raw.max())} tokens"
        )
    if stats.num_without_targets:
        advice.append(
            f"{stats.num_without_targets} record(s) have no supervised tokens (first: "
            f"{', '.join(stats.dropped_examples)}): check data.train_on and the chat template"
        )
    if waste > 0.2:
        advice.append(
            f"without packing {waste:.0%} of each micro-batch would be padding; keep packing on"
        )
    return DataReport(
        records=stats.num_records + bad_records,
        kept=len(examples),
        bad_records=bad_records,
        tokens=stats.num_tokens,
        supervised_tokens=stats.num_loss_tokens,
        supervised_fraction=stats.num_loss_tokens / max(stats.num_tokens, 1),
        without_supervised_tokens=stats.num_without_targets,
        truncated=stats.num_truncated,
        dropped_too_long=stats.num_dropped_too_long,
        split=stats.num_split,
        length_percentiles=percentiles,
        max_length=int(raw.max()),
        max_seq_len=max_seq_len,
        tokens_per_micro_batch=tokens_per_micro_batch,
        packing_efficiency=efficiency,
        padding_waste=waste,
        suggested_max_seq_len=suggested,
        advice=advice,
    )


def inspect_data(
    data: DataSection,
    tokenizer,
    tokens_per_micro_batch: int,
    seed: int = 0,
    keep_fields: bool = False,
) -> DataReport:
    """Read, validate and tokenise the training records of `data` as the run will see them (the
    sources' weights applied, an `eval_fraction` held out; with `keep_fields`, as an objective
    that samples replies does, prompts alone kept) and report on them."""
    from tuneforge.data.dataset import examples_for
    from tuneforge.data.reading import read_source
    from tuneforge.data.training_data import mix_of

    per_source, bad = [], 0
    for source in data.train:
        found, skipped = read_source(source, data.on_bad_record)
        per_source.append(found)
        bad += skipped.count
    conversations, _ = mix_of(data, per_source, seed)
    examples, stats = examples_for(conversations, tokenizer, data, Rendering.of(data), keep_fields)
    bad += stats.num_unrenderable  # left out by data.on_bad_record: skip, like malformed ones
    return build_report(examples, stats, data.max_seq_len, tokens_per_micro_batch, bad)


def preview_segments(tokenizer, conversation, rendering: Rendering) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, carries loss) segments, for `tuneforge data preview`;
    raises `DataError` where the template cannot render it."""
    from tuneforge.data.chat import tokenize_conversation

    tokenized = tokenize_conversation(tokenizer, conversation, rendering)
    segments: list[tuple[str, bool]] = []
    run: list[int] = []
    for index, (token, trained) in enumerate(
        zip(tokenized.input_ids, tokenized.loss_mask, strict=True)
    ):
        run.append(token)
        last = index + 1 == len(tokenized.input_ids)
        if last or tokenized.loss_mask[index + 1] != trained:
            segments.append((tokenizer.decode(run), trained))
            run = []
    return segments
