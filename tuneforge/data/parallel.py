"""Render and tokenise many records on several processes, in order, with a progress bar.

Rendering a chat template is Python work, so large datasets are cut into chunks that worker
processes render and tokenise; results come back in the original order as flat arrays. Workers
are spawned (not forked) and get the tokenizer pickled, chat template included.
"""

import multiprocessing
import os
import pickle
from collections.abc import Iterator

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tuneforge.data.chat import Rendering, TokenizedConversation, tokenize_conversations
from tuneforge.data.records import Conversation

AUTO_MIN_RECORDS = 20_000
"""Below this many records, starting worker processes costs more than it saves."""
MAX_AUTO_WORKERS = 8
CHUNK_RECORDS = 2048

_worker_tokenizer = None


def worker_count(requested: int | None, num_records: int) -> int:
    """Processes to use: as configured, or one per CPU (at most 8) for a large dataset."""
    if requested is not None:
        return requested
    if num_records < AUTO_MIN_RECORDS:
        return 0
    return min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0)))


def _start_worker(tokenizer_bytes: bytes) -> None:
    global _worker_tokenizer
    # each worker encodes on one core; the processes provide the parallelism
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = pickle.loads(tokenizer_bytes)


def _tokenize_chunk(
    task: tuple[list[Conversation], Rendering],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, str]]:
    """Flat ids and masks, each record's length, and the records that could not be rendered."""
    conversations, rendering = task
    results = list(tokenize_conversations(_worker_tokenizer, conversations, rendering))
    lengths = np.array([len(r.input_ids) for r in results], dtype=np.int64)
    ids = np.fromiter((t for r in results for t in r.input_ids), np.int64, int(lengths.sum()))
    mask = np.fromiter((m for r in results for m in r.loss_mask), np.bool_, int(lengths.sum()))
    errors = {i: r.error for i, r in enumerate(results) if r.error is not None}
    return ids, mask, lengths, errors


def _progress() -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def tokenize_all(
    tokenizer, conversations: list[Conversation], rendering: Rendering, workers: int
) -> Iterator[TokenizedConversation]:
    """`tokenize_conversations` of every record, on `workers` processes (0 or 1: this one)."""
    with _progress() as progress:
        task = progress.add_task("tokenising", total=len(conversations))
        if workers <= 1:
            for result in tokenize_conversations(tokenizer, conversations, rendering):
                progress.advance(task)
                yield result
            return
        chunks = [
            conversations[start : start + CHUNK_RECORDS]
            for start in range(0, len(conversations), CHUNK_RECORDS)
        ]
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers, _start_worker, (pickle.dumps(tokenizer),)) as pool:
            for ids, mask, lengths, errors in pool.imap(
                _tokenize_chunk, [(chunk, rendering) for chunk in chunks]
            ):
                start = 0
                for index, length in enumerate(lengths.tolist()):
                    yield TokenizedConversation(
                        ids[start : start + length].tolist(),
                        mask[start : start + length].tolist(),
                        errors.get(index),
                    )
                    start += length
                progress.advance(task, len(lengths))
