"""`dpo.reference: precomputed`: the reference's log-probability of every reply computed in one
pass before the first update, by the model as it then is, and carried with each batch — no copy
of the model and no reference forward per step. The values are cached beside the tokenised
data (keyed by the documents, the model's weights, the initial adapter and the precision) and
kept in the run directory, where a resume reads them, checked against the digest its checkpoint
recorded."""

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tuneforge.data.packing import PackedBatch
from tuneforge.data.side_data import DocumentValues
from tuneforge.data.splits import file_digest
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.train.frozen.passes import (
    FrozenPassData,
    bins_on,
    entry_dir,
    entry_key,
    model_identity,
    on_main_then_all,
    store_digest,
)
from tuneforge.train.objectives.pairs import (
    PairLogps,
    Reference,
    as_pairs,
    document_logps,
    token_counts,
)

NAME = "reference_logps"
RUN_FILES = ("reference_logps.npy", "reference_logps_eval.npy")
"""In the run directory: the training documents' values and the held-out batches' in order."""

log = logging.getLogger(__name__)


class PrecomputedReference(Reference):
    def __init__(self, digest: str) -> None:
        self.digest = digest
        """Of the values in the run directory, kept with each checkpoint."""

    def logps(self, batch: PackedBatch, chunk_tokens: int) -> PairLogps:
        values = batch.extras.get(NAME)
        if values is None:
            raise RuntimeError("a batch without its precomputed reference log-probabilities")
        return as_pairs(values, token_counts(batch))

    def resume_state(self) -> dict[str, Any]:
        return {"reference_logps_sha256": self.digest}


def values_digest(train: np.ndarray, held_out: np.ndarray) -> str:
    digest = hashlib.sha256()
    for values in (train, held_out):
        digest.update(np.ascontiguousarray(values, dtype=np.float32).tobytes())
    return digest.hexdigest()


@torch.no_grad()
def reference_logps(model: Decoder, batch: PackedBatch, chunk_tokens: int) -> torch.Tensor:
    """[documents] fp32: the reference's summed log-probability of each document's replies."""
    hidden = model.hidden_states(batch.tokens, batch.packed)
    return document_logps(hidden, model, batch, chunk_tokens)


def precomputed_reference(
    model: Decoder, data: FrozenPassData, chunk_tokens: int, resumed: dict[str, Any] | None
) -> PrecomputedReference:
    """Computes (or finds) the values and attaches them to the loader and the held-out batches;
    a resumed run (`resumed`: the objective's state in its checkpoint) reads its own from the run
    directory."""
    device = data.world.device
    was_training = model.training
    model.eval()
    try:
        if resumed is not None:
            train, held_out = values_from_run_dir(data.run_dir, resumed)
        else:
            train = _training_values(model, data, device, chunk_tokens)
            pieces = [reference_logps(model, b.to(device), chunk_tokens) for b in data.eval_batches]
            held_out = np.concatenate([p.cpu().numpy() for p in pieces] or [np.zeros(0)])
            if data.world.is_main:
                np.save(data.run_dir / RUN_FILES[0], train)
                np.save(data.run_dir / RUN_FILES[1], held_out.astype(np.float32))
    finally:
        model.train(was_training)
    data.loader.side_data = DocumentValues({NAME: train})
    start = 0
    for batch in data.eval_batches:
        batch.extras[NAME] = torch.from_numpy(held_out[start : start + batch.num_documents])
        start += batch.num_documents
    return PrecomputedReference(values_digest(train, held_out))


def _training_values(
    model: Decoder, data: FrozenPassData, device: torch.device, chunk_tokens: int
) -> np.ndarray:
    config = data.config
    lora, init = config.lora, config.lora.init_adapter
    key = entry_key(
        store_digest(data.loader.store),
        model_identity(config.model, config.train.seed),
        f"adapter:{file_digest(Path(init)) if lora.enabled and init else ''}",
        config.precision.model_dump_json(),
        config.model.dtype,
    )
    directory = entry_dir(data, "reference", key)

    def compute(partial: Path) -> None:
        values = np.zeros(len(data.loader.store), dtype=np.float32)
        log.info("reference: log-probabilities of %d documents, one pass", len(values))
        for indexes, batch in bins_on(data.loader, device):
            values[indexes] = reference_logps(model, batch, chunk_tokens).cpu().numpy()
        np.save(partial / f"{NAME}.npy", values)

    on_main_then_all(data, directory, compute)
    log.info("reference log-probabilities from %s", directory)
    return np.load(directory / f"{NAME}.npy")


def values_from_run_dir(run_dir: Path, resumed: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The values the run started with, as its checkpoint recorded them (checkpoints written
    before the digest was kept are taken as they are)."""
    files = [run_dir / name for name in RUN_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise TuneforgeError(
            f"resuming with dpo.reference: precomputed needs {', '.join(missing)}, written when "
            "the run started: the trained model is no longer the reference, so they cannot be "
            "made again; restore them, or start a new run"
        )
    train, held_out = (np.load(f, allow_pickle=False) for f in files)
    expected = resumed.get("reference_logps_sha256")
    if expected is not None and values_digest(train, held_out) != expected:
        raise TuneforgeError(
            f"resuming with dpo.reference: precomputed: {', '.join(map(str, files))} are not the "
            "values the run started with (its checkpoint recorded others): restore the run's "
            "own files, or start a new run"
        )
    return train, held_out
