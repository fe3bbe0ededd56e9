"""Step checkpoints for exact resume: model (or adapter) and optimizer state through
`torch.distributed.checkpoint` (sharded, reshards on load), the loop state as JSON, and the RNG
state of every rank.

A checkpoint is written to `checkpoints/.step_N.partial` and renamed to `checkpoints/step_N`
only when every rank has finished, then `checkpoints/latest` is pointed at it and older ones
beyond `keep_last` are removed; a process killed while writing leaves the previous checkpoint
as it was.
"""

import base64
import contextlib
import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from tuneforge.errors import TuneforgeError
from tuneforge.parallel.distributed import Dist, barrier
from tuneforge.runs.files import CHECKPOINTS, LATEST, STATE_FILE, WEIGHTS_DIR

OPTIONS = StateDictOptions(ignore_frozen_params=True)
"""Only what trains is saved: adapters (and modules_to_save) for LoRA, everything otherwise."""
LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)
"""Frozen weights are absent from the checkpoint; `dcp.load` already fails on a missing
trainable one."""


@dataclass
class LoopState:
    step: int
    tokens_seen: int
    loader: dict[str, int]
    elapsed_s: float
    world_size: int
    settings: dict[str, Any]
    """Memory-critical settings the run was started with (checked on resume)."""
    nonfinite_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), position, has_gauss, cached],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))

    def decode(text: str) -> torch.Tensor:
        return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())

    torch.set_rng_state(decode(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(decode(state["cuda"]))


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it assumes one process when there is no process group; that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _write_json(file: Path, data: Any) -> None:
    partial = file.with_name(f".{file.name}.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, file)


def save_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: LoopState,
    world: Dist,
    keep_last: int,
) -> tuple[Path, float]:
    """Write the checkpoint of `state.step` on every rank; returns its path and the seconds taken."""
    start = time.perf_counter()
    root = run_dir / CHECKPOINTS
    final = root / f"step_{state.step}"
    partial = root / f".step_{state.step}.partial"
    if world.is_main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    with _single_process_quiet():
        dcp.save(
            {"model": model_state, "optim": optimizer_state}, checkpoint_id=partial / WEIGHTS_DIR
        )
    (partial / f"rng_rank{world.rank}.json").write_text(json.dumps(rng_state()))
    barrier()
    if world.is_main:
        _write_json(partial / STATE_FILE, asdict(state))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _write_json(root / LATEST, {"step": state.step, "path": final.name})
        steps = sorted((int(p.name.split("_")[1]), p) for p in root.glob("step_*") if p.is_dir())
        for _, old in steps[:-keep_last]:
            shutil.rmtree(old)
    barrier()
    return final, time.perf_counter() - start


def _load_failure(error: CheckpointException) -> str:
    """The reason in a failed `dcp.load`'s text (missing key, size mismatch), else its last line."""
    text = str(error)
    # the text quotes the raising source line first, then the error itself
    found = re.findall(r"(?:Missing key|[Ss]ize mismatch)[^\n]*", text)
    if found:
        return found[-1].rstrip(".")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def read_loop_state(checkpoint: Path) -> LoopState:
    return LoopState(**json.loads((checkpoint / STATE_FILE).read_text()))


def load_checkpoint(
    checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: Dist
) -> LoopState:
    """Restore weights, optimizer and this rank's RNG (when the checkpoint has this rank)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_state, "optim": optimizer_state}
    try:
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=checkpoint / WEIGHTS_DIR)
    except CheckpointException as error:  # a BaseException, with every rank's traceback in it
        raise TuneforgeError(
            f"{checkpoint}: cannot restore this run from it ({_load_failure(error)}): it holds "
            "other weights (another model, other LoRA targets or ranks, or an older tuneforge "
            "that named them otherwise); restore the settings it was written with, or start a "
            "new run in another run.output_dir"
        ) from None
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=optimizer_state,
        options=LOAD_OPTIONS,
    )
    rng_file = checkpoint / f"rng_rank{world.rank}.json"
    if rng_file.is_file():
        set_rng_state(json.loads(rng_file.read_text()))
    return read_loop_state(checkpoint)
