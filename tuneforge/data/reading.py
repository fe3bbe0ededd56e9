"""From a configured source to validated conversations, with the bad-record policy applied."""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tuneforge.config.sections.data import DataSource
from tuneforge.data.formats import to_conversation
from tuneforge.data.packed_npy import iter_packed_documents
from tuneforge.data.records import (
    Conversation,
    DataError,
    RecordError,
    expand_paths,
    iter_hub_records,
    iter_raw_records,
)

log = logging.getLogger(__name__)
SHOWN_PROBLEMS = 10


@dataclass
class BadRecords:
    count: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, origin: str, reason: str) -> None:
        self.count += 1
        if len(self.reasons) < SHOWN_PROBLEMS:
            self.reasons.append(f"{origin}: {reason}")


def read_conversations(
    path: Path,
    format_name: str,
    field_map: dict[str, str] | None = None,
    on_bad_record: str = "error",
    metadata: Path | None = None,
    hub: tuple[str, str | None, str] | None = None,
) -> tuple[list[Conversation], BadRecords]:
    """Every record of `path` (a file, directory or glob; with `hub`, (id, subset, split) of the
    hub dataset snapshot there) as a Conversation. With `on_bad_record="error"` one error lists
    every bad record (the first ten shown); with `"skip"` they are left out and counted."""
    conversations: list[Conversation] = []
    bad = BadRecords()
    files = [path] if hub is not None else expand_paths(path)
    for file in files:
        if format_name == "mlperf":
            for documents, origin in iter_packed_documents(file, metadata):
                if isinstance(documents, RecordError):
                    bad.add(origin, str(documents))
                else:
                    conversations.extend(documents)
            continue
        records = iter_hub_records(file, *hub) if hub is not None else iter_raw_records(file)
        for record, origin in records:
            try:
                conversations.append(to_conversation(record, format_name, field_map or {}, origin))
            except RecordError as error:
                bad.add(origin, str(error))
    if bad.count and on_bad_record == "error":
        shown = "\n  ".join(bad.reasons)
        more = (
            f"\n  ... and {bad.count - len(bad.reasons)} more"
            if bad.count > len(bad.reasons)
            else ""
        )
        raise DataError(
            f"{bad.count} bad record(s) in {path} (format {format_name}):\n  {shown}{more}\n"
            "fix them, or set data.on_bad_record: skip to leave them out"
        )
    if bad.count:
        log.warning(
            "skipped %d bad record(s) in %s; first: %s", bad.count, path, "; ".join(bad.reasons[:3])
        )
    if not conversations:
        raise DataError(f"{path} holds no usable records")
    return conversations, bad


def read_source(source: DataSource, on_bad_record: str) -> tuple[list[Conversation], BadRecords]:
    hub = (source.hub, source.subset, source.split) if source.hub is not None else None
    return read_conversations(
        source.files, source.format, source.field_map, on_bad_record, source.metadata, hub
    )
