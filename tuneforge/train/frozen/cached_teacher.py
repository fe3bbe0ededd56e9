"""`distill.teacher_logits: cached`: the teacher runs once over the training documents before
the first step, and its top-k logits and token ids of every supervised token are kept
memory-mapped on disk (keyed by the tokenised documents, the teacher's weights, its dtype and
k); the teacher is then freed, so it need not fit beside the student. Each batch carries its
rows; the held-out batches' rows are kept in the same entry."""

import contextlib
import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from numpy.lib.format import open_memmap

from tuneforge.data.packing import PackedBatch
from tuneforge.data.side_data import TokenRows, supervised_offsets
from tuneforge.data.token_store import TokenStore
from tuneforge.models.api import model_args
from tuneforge.models.decoder import Decoder
from tuneforge.train.frozen.passes import (
    FrozenPassData,
    batches_digest,
    bins_on,
    document_rows,
    entry_dir,
    entry_key,
    model_identity,
    on_main_then_all,
    store_digest,
    supervised_rows,
)
from tuneforge.train.frozen.teacher import Targets, Teacher, check_vocabulary

LOGITS, IDS = "teacher_logits", "teacher_ids"
EVAL_FILES = ("eval_logits.npy", "eval_token_ids.npy")
"""The held-out batches' rows, one batch after another."""

log = logging.getLogger(__name__)


class CachedTeacher:
    """The teacher's distribution from the rows each batch carries: its top-k logits
    renormalised at the loss's temperature (`distill_loss.teacher_top_k`, computed before)."""

    def targets(
        self, batch: PackedBatch, supervised: torch.Tensor, temperature: float, top_k: int | None
    ) -> Targets:
        logits, ids = batch.extras.get(LOGITS), batch.extras.get(IDS)
        if logits is None or ids is None or logits.shape[0] != supervised.numel():
            raise RuntimeError("a batch without its cached teacher logits for every target")

        def chunk(part: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
            return F.log_softmax(logits[part].float() / temperature, dim=-1), ids[part].long()

        return chunk


def allocate_rows(
    directory: Path, store: TokenStore, k: int
) -> tuple[np.memmap, np.memmap, np.ndarray]:
    """Memory-mapped [supervised tokens, k] logits (fp32) and ids (int32), and the offsets."""
    offsets = supervised_offsets(np.asarray(store.loss_mask), np.asarray(store.offsets))
    np.save(directory / "offsets.npy", offsets)
    shape = (int(offsets[-1]), k)
    logits = open_memmap(directory / "logits.npy", mode="w+", dtype=np.float32, shape=shape)
    ids = open_memmap(directory / "token_ids.npy", mode="w+", dtype=np.int32, shape=shape)
    return logits, ids, offsets


def read_rows(directory: Path) -> TokenRows:
    rows = {
        LOGITS: np.load(directory / "logits.npy", mmap_mode="r"),
        IDS: np.load(directory / "token_ids.npy", mmap_mode="r"),
    }
    return TokenRows(rows, np.load(directory / "offsets.npy"))


@torch.no_grad()
def top_rows(teacher: Teacher, batch: PackedBatch, k: int, chunk_tokens: int):
    """(logits, ids) [supervised tokens, k] of the teacher's k likeliest tokens at each target."""
    model = teacher.model
    hidden = model.hidden_states(batch.tokens, batch.packed).index_select(0, supervised_rows(batch))
    values, ids = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        top = (hidden[start : start + chunk_tokens] @ model.lm_head.weight.t()).float().topk(k)
        values.append(top.values)
        ids.append(top.indices.int())
    return torch.cat(values), torch.cat(ids)


def cached_teacher(
    load_teacher, student: Decoder, data: FrozenPassData, chunk_tokens: int
) -> CachedTeacher:
    """`load_teacher()` builds the teacher model, only when its rows are not cached yet; it is
    freed before training."""
    config, device = data.config, data.world.device
    distill = config.distill
    assert distill.teacher is not None and distill.top_k is not None
    k = distill.top_k
    source = distill.teacher.path or distill.teacher.name
    assert source is not None
    teacher_args = model_args(source, distill.teacher.num_layers)  # config.json, no weights
    check_vocabulary(teacher_args.vocab_size, student.args.vocab_size)
    key = entry_key(
        store_digest(data.loader.store),
        batches_digest(data.eval_batches),
        model_identity(distill.teacher, config.train.seed),
        f"top_k:{k}",
    )
    directory = entry_dir(data, "teacher", key)

    def compute(partial: Path) -> None:
        with student_aside(student, device):
            teacher = Teacher(load_teacher(), student)
            logits, ids, offsets = allocate_rows(partial, data.loader.store, k)
            log.info("teacher: top-%d logits of %d targets, one pass", k, logits.shape[0])
            for indexes, batch in bins_on(data.loader, device):
                rows = document_rows(offsets, indexes)
                values, tokens = top_rows(teacher, batch, k, chunk_tokens)
                logits[rows], ids[rows] = values.cpu().numpy(), tokens.cpu().numpy()
            logits.flush()
            ids.flush()
            held_out = [top_rows(teacher, b.to(device), k, chunk_tokens) for b in data.eval_batches]
            for index, name in enumerate(EVAL_FILES):
                pieces = [pair[index].cpu().numpy() for pair in held_out]
                np.save(partial / name, np.concatenate(pieces) if pieces else np.zeros((0, k)))
            del teacher, held_out

    on_main_then_all(data, directory, compute)
    log.info("teacher logits from %s", directory)
    data.loader.side_data = read_rows(directory)
    held_logits, held_ids = (np.load(directory / name) for name in EVAL_FILES)
    start = 0
    for batch in data.eval_batches:
        rows = slice(start, start + batch.num_loss_tokens)
        batch.extras |= {
            LOGITS: torch.from_numpy(held_logits[rows]),
            IDS: torch.from_numpy(held_ids[rows]),
        }
        start += batch.num_loss_tokens
    return CachedTeacher()


@contextlib.contextmanager
def student_aside(student: Decoder, device: torch.device) -> Iterator[None]:
    """The student in host memory while the teacher runs alone on the GPU, then back: the pass
    needs the teacher's memory, not both models'."""
    on_gpu = device.type == "cuda"
    if on_gpu:
        student.to("cpu")
        torch.cuda.empty_cache()
    try:
        yield
    finally:
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
            student.to(device)
