"""From configured sources to training examples, with counts of what was kept and dropped."""

import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from tuneforge.config.sections.data import DataSection
from tuneforge.data.chat import Rendering
from tuneforge.data.length_policy import (
    RecordLengths,
    Span,
    count_targets,
    has_targets,
    pieces,
    target_spans,
)
from tuneforge.data.parallel import tokenize_all, worker_count
from tuneforge.data.records import ORIGIN_FIELD, Conversation, DataError
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
    num_unrenderable: int = 0
    """Records the chat template could not render (left out with data.on_bad_record: skip)."""
    num_identical_pairs: int = 0
    """Preference pairs whose chosen and rejected replies are the same: they carry no preference."""
    num_tokens: int = 0
    num_loss_tokens: int = 0
    dropped_examples: list[str] = field(default_factory=list)
    identical_examples: list[str] = field(default_factory=list)
    unrenderable_examples: list[str] = field(default_factory=list)
    records: RecordLengths = field(default_factory=lambda: RecordLengths([], []))
    """Tokenised length of every record before truncation or dropping, and where its supervised
    labels are: what the planner applies the length policy to."""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DatasetStats":
        """Back from `dataclasses.asdict` (the cache's meta.json)."""
        records = values.get("records", {})
        spans = records.get("spans")
        found = RecordLengths(
            records.get("lengths", []), None if spans is None else [tuple(s) for s in spans]
        )
        return cls(**(values | {"records": found}))

    @property
    def num_left_out(self) -> int:
        """Records that became no document: too long, nothing to learn, unrenderable."""
        return (
            self.num_dropped_too_long
            + self.num_without_targets
            + self.num_unrenderable
            + self.num_identical_pairs
        )

    @property
    def raw_lengths(self) -> list[int]:
        return self.records.lengths


def piece_of(whole: Example, piece: Span, truncated: bool) -> Example:
    """One document cut from a record's example: a split piece keeps its labels; a truncated
    record's last label goes (the token it predicts is cut off)."""
    start, end = piece
    labels = whole.labels[start:end]
    if truncated:
        labels = [*labels[:-1], IGNORE_INDEX]
    return Example(whole.input_ids[start:end], labels, whole.fields)


def build_examples(
    conversations: list[Conversation],
    tokenizer,
    max_seq_len: int,
    on_too_long: str,
    rendering: Rendering,
    *,
    split_long: bool = False,
    workers: int | None = 0,
    on_bad_record: str = "error",
    keep_fields: bool = False,
) -> tuple[list[Example], DatasetStats]:
    """Tokenise (on `workers` processes, see `parallel.worker_count`), apply the length policy
    and drop records without supervised tokens, counting each. A record the chat template cannot
    render stops it, or is counted and left out with `on_bad_record="skip"`. With `keep_fields`
    (an objective that samples replies and scores them) each example carries its record's other
    fields, and a record of a prompt alone is kept whole; without, it has nothing to train."""
    lengths: list[int] = []
    record_spans: list[tuple[int, ...]] = []
    stats = DatasetStats(records=RecordLengths(lengths, record_spans))
    examples: list[Example] = []
    tokenized_all = tokenize_all(
        tokenizer, conversations, rendering, worker_count(workers, len(conversations))
    )
    for conversation, tokenized in zip(conversations, tokenized_all, strict=True):
        stats.num_records += 1
        if tokenized.error is not None:
            if on_bad_record != "skip":
                raise DataError(f"{tokenized.error}; or set data.on_bad_record: skip")
            stats.num_unrenderable += 1
            if len(stats.unrenderable_examples) < 5:
                stats.unrenderable_examples.append(tokenized.error)
            continue
        ids, mask = tokenized.input_ids, tokenized.loss_mask
        spans = target_spans(mask)
        lengths.append(len(ids))
        record_spans.append(spans)
        too_long = len(ids) > max_seq_len
        prompt = keep_fields and conversation.is_prompt
        # a prompt cut would lose what it asks: too long, it is dropped (or stops the run)
        policy = ("error" if on_too_long == "error" else "drop") if prompt else on_too_long
        split = split_long and not prompt
        if too_long and not split and policy == "error":
            raise DataError(
                f"{conversation.origin}: {len(ids)} tokens exceed data.max_seq_len={max_seq_len}; "
                "raise it, or set data.on_too_long to truncate or drop"
            )
        bounds = pieces(len(ids), max_seq_len, policy, split)
        truncated = too_long and not split
        if too_long:
            if split:
                stats.num_split += 1
            elif bounds:
                stats.num_truncated += 1
            else:
                stats.num_dropped_too_long += 1
                continue
        kept = bounds if prompt else [p for p in bounds if has_targets(p, spans, truncated)]
        if not kept:
            stats.num_without_targets += 1
            if len(stats.dropped_examples) < 5:
                stats.dropped_examples.append(conversation.origin)
            continue
        whole = make_example(ids, mask)
        if keep_fields:
            fields = json_values(conversation.fields or {}) | {ORIGIN_FIELD: conversation.origin}
            whole = replace(whole, fields=fields)
        for piece in kept:
            examples.append(whole if piece == (0, len(ids)) else piece_of(whole, piece, truncated))
            stats.num_tokens += piece[1] - piece[0]
            stats.num_loss_tokens += count_targets(piece, spans, truncated)
    if not examples:
        prompts = not keep_fields and any(c.is_prompt for c in conversations)
        raise DataError(
            f"no trainable examples among {stats.num_records} records: "
            f"{stats.num_dropped_too_long} too long, {stats.num_without_targets} without loss "
            f"tokens, {stats.num_unrenderable} the chat template cannot render"
            + ("; records of format prompt have no reply to learn: they are for train.objective "
               "grpo, which samples the replies" if prompts else "")
        )  # fmt: skip
    return examples, stats


def json_values(fields: dict[str, object]) -> dict[str, object]:
    """A record's fields as the cache keeps them (JSON values: a date becomes its text), so a
    run reads the same values whether it tokenised the data or found it cached."""
    return json.loads(json.dumps(fields, default=str))


def report_left_out(stats: DatasetStats, max_seq_len: int) -> None:
    """Say, always (from the cache too), what the length policy and the template did to
    records."""
    too_long = stats.num_truncated + stats.num_dropped_too_long + stats.num_split
    if too_long:
        log.warning(
            "%d of %d record(s) are longer than data.max_seq_len=%d: %d truncated, %d dropped, "
            "%d split (data.on_too_long, data.split_long; `tuneforge data inspect` shows the "
            "lengths)",
            too_long,
            stats.num_records,
            max_seq_len,
            stats.num_truncated,
            stats.num_dropped_too_long,
            stats.num_split,
        )
    if stats.num_without_targets:
        log.warning(
            "%d record(s) have no tokens that carry loss and were skipped (first: %s)",
            stats.num_without_targets,
            ", ".join(stats.dropped_examples),
        )
    if stats.num_identical_pairs:
        log.warning(
            "%d pair(s) have the same chosen and rejected reply and were left out: they carry no "
            "preference and train nothing (first: %s)",
            stats.num_identical_pairs,
            ", ".join(stats.identical_examples),
        )
    if stats.num_unrenderable:
        log.warning(
            "%d record(s) the chat template cannot render were skipped (first: %s)",
            stats.num_unrenderable,
            stats.unrenderable_examples[0],
        )


def examples_for(
    conversations: list[Conversation],
    tokenizer,
    data: DataSection,
    rendering: Rendering,
    keep_fields: bool = False,
):
    """`build_examples` with the length, bad-record and worker settings of a data section."""
    return build_examples(
        conversations,
        tokenizer,
        data.max_seq_len,
        data.on_too_long,
        rendering,
        split_long=data.split_long,
        workers=data.tokenize_workers,
        on_bad_record=data.on_bad_record,
        keep_fields=keep_fields,
    )
