"""KTO's records as documents of a token store: record u is documents 2u (its prompt with its
completion, supervised on the completion) and 2u + 1 (its prompt with another record's
completion: the mismatched sample KTO estimates its KL reference point from, as TRL builds it),
packed whole like a preference pair (`data/pairs.py`). The first document carries the record's
label (`LABEL`: true for a reply to learn, false for one to avoid).

Records of format unpaired keep their order; a preference pair becomes two records, its chosen
reply desirable and its rejected one not, after the unpaired records: one of each pair in a
first half and the other in a second, the labels alternating (micro-batches are packed by
length, and records of equal length are placed in order: alternating labels mix them), and no
two neighbours sharing a prompt. Record u's mismatched completion is record u − 1's (the first
takes the last's), TRL's rotation."""

from dataclasses import replace

from tuneforge.config.sections.data import DataSection
from tuneforge.data.chat import Rendering
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.pairs import two_document_examples, with_rejected_reply
from tuneforge.data.records import Conversation, DataError
from tuneforge.data.token_store import Example

LABEL = "label"
"""The field of a record's first document that holds its label (a bool)."""


def labelled_records(conversations: list[Conversation]) -> list[Conversation]:
    """Each record with its label: unpaired records as they are, each preference pair split into
    a desirable and an undesirable record, their labels alternating."""
    unpaired: list[Conversation] = []
    halves: tuple[list[Conversation], list[Conversation]] = ([], [])
    for conversation in conversations:
        if conversation.desirable is not None:
            unpaired.append(conversation)
        elif conversation.rejected is not None:
            chosen = replace(conversation, desirable=True, rejected=None)
            rejected = replace(with_rejected_reply(conversation), desirable=False, rejected=None)
            # pair p gives the first half its chosen reply where p is even, its rejected one
            # where odd, and the second half the other: neighbours never share a prompt
            flip = len(halves[0]) % 2
            halves[0].append((chosen, rejected)[flip])
            halves[1].append((rejected, chosen)[flip])
        else:
            raise DataError(
                f"{conversation.origin}: KTO trains on labelled replies, and this record has no "
                "label: use data format unpaired (prompt, completion, label) or preference "
                "(prompt, chosen, rejected)"
            )
    return unpaired + halves[0] + halves[1]


def with_mismatched(records: list[Conversation]) -> list[Conversation]:
    """[record 0, its mismatched sample, record 1, ...]: each record's prompt with the previous
    record's completion."""
    documents = []
    for index, record in enumerate(records):
        previous = records[index - 1]
        mismatched = [*record.messages[:-1], previous.messages[-1]]
        documents += [record, replace(record, messages=mismatched)]
    return documents


def unpaired_examples(
    conversations: list[Conversation],
    tokenizer,
    data: DataSection,
    rendering: Rendering,
    tokens_per_micro_batch: int,
) -> tuple[list[Example], DatasetStats]:
    """Two documents per labelled record, the first carrying its label."""
    records = labelled_records(conversations)
    fields: list[dict[str, object]] = [{LABEL: record.desirable} for record in records]
    return two_document_examples(
        records,
        with_mismatched(records),
        tokenizer,
        data,
        rendering,
        tokens_per_micro_batch,
        unit="labelled record",
        fields=fields,
        preference=False,
    )
