"""Preference pairs as documents of a token store: pair p is documents 2p (the chosen reply's
conversation) and 2p + 1 (the rejected one's, the same prompt), each supervised on its last
reply only, and a micro-batch holds whole pairs, each pair's two documents side by side, packed
without padding. A pair is never truncated (that would cut a reply): one too long for
`data.max_seq_len` or for a micro-batch is left out, or stops the run with
`data.on_too_long: error`."""

from dataclasses import replace

from tuneforge.config.sections.data import DataSection
from tuneforge.data.bin_packing import STRATEGIES
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.length_policy import RecordLengths, target_spans
from tuneforge.data.parallel import tokenize_all, worker_count
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.token_store import Example, make_example


def pair_conversations(conversations: list[Conversation]) -> list[Conversation]:
    """[chosen, rejected, chosen, rejected, ...]: each preference record as two conversations
    that share its prompt."""
    documents = []
    for conversation in conversations:
        if conversation.rejected is None:
            raise DataError(
                f"{conversation.origin}: preference training needs pairs, and this record has no "
                "rejected reply: use data format preference (prompt, chosen, rejected)"
            )
        documents += [conversation, with_rejected_reply(conversation)]
    return documents


def with_rejected_reply(conversation: Conversation) -> Conversation:
    """A preference record's conversation ending with its rejected reply instead of the chosen."""
    assert conversation.rejected is not None
    rejected = {"role": "assistant", "content": conversation.rejected}
    return replace(conversation, messages=[*conversation.messages[:-1], rejected])


def pair_examples(
    conversations: list[Conversation],
    tokenizer,
    data: DataSection,
    rendering: Rendering,
    tokens_per_micro_batch: int,
) -> tuple[list[Example], DatasetStats]:
    """The pairs' documents (2 per record, chosen first), each supervised on its last reply;
    where a record has a `margin` field, every pair carries its margin (0 where it has none)."""
    documents = pair_conversations(conversations)
    margins = [pair_margin(c) for c in conversations]
    fields: list[dict[str, object]] | None = None
    if any(m is not None for m in margins):
        fields = [{MARGIN: m} for m in margins]
    return two_document_examples(
        conversations, documents, tokenizer, data, rendering, tokens_per_micro_batch, fields=fields
    )


MARGIN = "margin"
"""A preference record's field holding how much more its chosen reply is preferred (a reward
model's margin; TRL's column of that name)."""


def pair_margin(conversation: Conversation) -> float | None:
    value = (conversation.fields or {}).get(MARGIN)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataError(
            f"{conversation.origin}: its field {MARGIN} is {value!r}; a margin is a number (how "
            "much more the chosen reply is preferred), or leave the field out"
        )
    return float(value)


def two_document_examples(
    units: list[Conversation],
    documents: list[Conversation],
    tokenizer,
    data: DataSection,
    rendering: Rendering,
    tokens_per_micro_batch: int,
    unit: str = "pair",
    fields: list[dict[str, object]] | None = None,
    preference: bool = True,
) -> tuple[list[Example], DatasetStats]:
    """Two documents per unit (`documents` 2u and 2u + 1 for `units[u]`, the record a unit comes
    from; `unit` names it in messages), each supervised on its last reply; a unit too long,
    unrenderable or without a reply is left out whole. With `preference` (the units are pairs)
    one whose replies are the same is left out: it carries no preference. `fields[u]` goes with
    a unit's first document."""
    reply_only = replace(rendering, train_on="last_assistant")
    workers = worker_count(data.tokenize_workers, len(documents))
    tokenized = list(tokenize_all(tokenizer, documents, reply_only, workers))
    lengths: list[int] = []
    spans: list[tuple[int, ...]] = []
    stats = DatasetStats(records=RecordLengths(lengths, spans))
    examples: list[Example] = []
    for index, conversation in enumerate(units):
        pair = tokenized[2 * index : 2 * index + 2]
        stats.num_records += 1
        errors = [t.error for t in pair if t.error is not None]
        if errors:
            if data.on_bad_record != "skip":
                raise DataError(f"{errors[0]}; or set data.on_bad_record: skip")
            stats.num_unrenderable += 1
            stats.unrenderable_examples.append(errors[0])
            continue
        sizes = [len(t.input_ids) for t in pair]
        lengths.append(sum(sizes))
        spans.append(target_spans(pair[0].loss_mask))
        if max(sizes) > data.max_seq_len or sum(sizes) > tokens_per_micro_batch:
            if data.on_too_long == "error":
                raise DataError(
                    f"{conversation.origin}: its {unit} has {sizes[0]} + {sizes[1]} tokens, more "
                    f"than data.max_seq_len={data.max_seq_len} for a document or "
                    f"train.tokens_per_micro_batch={tokens_per_micro_batch} for both; raise "
                    f"them, or set data.on_too_long: drop ({unit}s are never truncated)"
                )
            stats.num_dropped_too_long += 1
            continue
        if preference and pair[0].input_ids == pair[1].input_ids:
            stats.num_identical_pairs += 1
            if len(stats.identical_examples) < 5:
                stats.identical_examples.append(conversation.origin)
            continue
        if not all(any(t.loss_mask) for t in pair):
            stats.num_without_targets += 1
            stats.dropped_examples.append(conversation.origin)
            continue
        for position, t in enumerate(pair):
            example = make_example(t.input_ids, t.loss_mask)
            if fields is not None:
                example = replace(example, fields=fields[index] if position == 0 else {})
            examples.append(example)
            stats.num_tokens += len(t.input_ids)
            stats.num_loss_tokens += sum(t.loss_mask[1:])
    if not examples:
        identical = (
            f", {stats.num_identical_pairs} whose chosen and rejected replies are the same"
            if preference
            else ""
        )
        raise DataError(
            f"no trainable {unit}s among {stats.num_records} records: "
            f"{stats.num_dropped_too_long} too long, {stats.num_without_targets} without a reply "
            f"to train on{identical}, {stats.num_unrenderable} the chat template cannot render"
        )
    return examples, stats


def pair_bins(lengths: list[int], budget: int, strategy: str = "ffd") -> list[list[int]]:
    """Micro-batches of whole pairs: documents [2p, 2p + 1, 2q, 2q + 1, ...], at most `budget`
    tokens each, packed by the pairs' total lengths."""
    if len(lengths) % 2:
        raise ValueError(f"pairs come as two documents each; got {len(lengths)} documents")
    if strategy not in STRATEGIES:
        raise ValueError(f"pairs are packed with one of {sorted(STRATEGIES)}, not {strategy!r}")
    totals = [lengths[2 * pair] + lengths[2 * pair + 1] for pair in range(len(lengths) // 2)]
    return [
        [document for pair in sorted(bin_) for document in (2 * pair, 2 * pair + 1)]
        for bin_ in STRATEGIES[strategy](totals, budget)
    ]
