"""Step checkpoints for exact resume: model (or adapter) and optimizer state through
`torch.distributed.checkpoint` (sharded, reshards on load), the loop state as JSON, and the RNG
state of every rank. Weights the run keeps an accurate copy of (fp32 masters) are saved as that
copy, whatever the strategy.

A checkpoint is written to `checkpoints/.step_N.partial` and renamed to `checkpoints/step_N`
only when every rank has finished, then `checkpoints/latest` is pointed at it and older ones
beyond `keep_last` are removed; a process killed while writing, or a disk that fills up, leaves
the previous checkpoint as it was. `state.json`, written last, lists every file's size, so a
damaged checkpoint is found before it is loaded (`runs.checkpoints`).
"""

import base64
import contextlib
import json
import logging
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
from tuneforge.hardware.gpus import GIB
from tuneforge.parallel.distributed import Dist, barrier
from tuneforge.runs.checkpoint_dirs import (
    complete_checkpoints,
    file_sizes,
    keep_aside,
    newest_intact,
    step_of,
)
from tuneforge.runs.files import CHECKPOINTS, LATEST, STATE_FILE, WEIGHTS_DIR
from tuneforge.train.master_adamw import accurate_weights, split_accurate_weights
from tuneforge.train.safe_dcp_reader import (
    DamagedCheckpointError,
    SafeLoadPlanner,
    SafeReader,
    read_metadata_file,
)

log = logging.getLogger(__name__)

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
    """The data-parallel ranks the loader's position counts (tensor-parallel ranks read the
    same data and count once)."""
    settings: dict[str, Any]
    """Memory-critical settings the run was started with (checked on resume)."""
    nonfinite_steps: int = 0
    objective: dict[str, Any] = field(default_factory=dict)
    """The objective's `resume_state()`, handed back to its builder on resume."""
    files: dict[str, int] = field(default_factory=dict)
    """Every other file of the checkpoint and its size in bytes (filled in by the save)."""


class CheckpointWriteError(TuneforgeError):
    """A checkpoint that could not be written (a full disk, a file system gone read-only)."""


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
def _dcp_quiet() -> Iterator[None]:
    """DCP warns that it assumes one process when there is no process group (intended), and logs
    every failure with its whole text (reported here in a line instead)."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.endswith("dcp_logger")
    ]
    disabled = [logger.disabled for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        for logger in loggers:
            logger.disabled = True
        try:
            yield
        finally:
            for logger, was in zip(loggers, disabled, strict=True):
                logger.disabled = was


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
    """Write the checkpoint of `state.step` on every rank; returns its path and the seconds taken.
    Refuses to start without room for it, and turns a failed write into one clear error."""
    start = time.perf_counter()
    root = run_dir / CHECKPOINTS
    final = root / f"step_{state.step}"
    partial = root / f".step_{state.step}.partial"
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    accurate_weights(model_state, optimizer_state)
    content = {"model": model_state, "optim": optimizer_state}
    needed = _expected_size(root, content)
    _refuse_without_room(root, needed, state.step, world)
    try:
        if world.is_main:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        barrier()
        with _dcp_quiet():
            dcp.save(content, checkpoint_id=partial / WEIGHTS_DIR)
        (partial / f"rng_rank{world.rank}.json").write_text(json.dumps(rng_state()))
        barrier()
        if world.is_main:
            _write_json(partial / STATE_FILE, asdict(state) | {"files": file_sizes(partial)})
    except (CheckpointException, OSError) as error:
        if world.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        raise _write_failure(root, needed, state.step, error) from None
    if world.is_main:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        _write_json(root / LATEST, {"step": state.step, "path": final.name})
        steps = sorted((step_of(p), p) for p in root.glob("step_*") if p.is_dir())
        for _, old in steps[:-keep_last]:
            shutil.rmtree(old)
    barrier()
    return final, time.perf_counter() - start


def _expected_size(root: Path, content: dict[str, Any]) -> int:
    """Bytes the new checkpoint will take: as much as the last one, else its tensors' bytes."""
    for previous in complete_checkpoints(root.parent):
        sizes = file_sizes(previous)
        if sizes:
            return sum(sizes.values())
    total = 0
    for values in content.values():
        for value in _tensors(values):
            total += value.numel() * value.element_size()  # a DTensor counts its whole shape
    return total


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _room_message(root: Path, needed: int, step: int) -> str:
    free = shutil.disk_usage(root if root.exists() else root.parent).free
    previous = complete_checkpoints(root.parent)
    kept = f"{previous[0]} is intact" if previous else "no earlier checkpoint exists"
    return (
        f"{root}: {free / GIB:.2f} GiB free, the checkpoint of step {step} needs about "
        f"{needed / GIB:.2f} GiB; {kept}. Free space there (or lower checkpoint.keep_last, or "
        "set run.output_dir on a larger file system), then run the same command with "
        "--resume auto"
    )


def _refuse_without_room(root: Path, needed: int, step: int, world: Dist) -> None:
    """Stop before writing when the file system cannot hold the checkpoint (every rank stops)."""
    root.mkdir(parents=True, exist_ok=True)
    short = shutil.disk_usage(root).free < needed * 1.05 if world.is_main else False
    if torch.distributed.is_initialized():
        flag = torch.tensor([float(short)], device=world.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        short = bool(flag.item())
    if short:
        raise CheckpointWriteError(_room_message(root, needed, step))


def _write_failure(root: Path, needed: int, step: int, error: BaseException) -> TuneforgeError:
    reason = _load_failure(error) if isinstance(error, CheckpointException) else str(error)
    if shutil.disk_usage(root).free < needed * 1.05:
        return CheckpointWriteError(
            f"writing a checkpoint failed ({reason}): " + _room_message(root, needed, step)
        )
    return CheckpointWriteError(
        f"{root}: the checkpoint of step {step} could not be written ({reason}); the previous "
        "checkpoint is untouched. Make the directory writable, then run the same command with "
        "--resume auto"
    )


def _load_failure(error: CheckpointException) -> str:
    """The reason in a failed `dcp` call's text (missing key, size mismatch), else its last line."""
    text = str(error)
    # the text quotes the raising source line first, then the error itself
    found = re.findall(r"(?:Missing key|[Ss]ize mismatch)[^\n]*", text)
    if found:
        return found[-1].rstrip(".")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _read_failure(checkpoint: Path, error: CheckpointException) -> TuneforgeError:
    """Refused content as such; other weights (a missing key, a size mismatch) with what to do;
    anything else that fails to read back is damage."""
    for failure, _ in error.failures.values():
        if isinstance(failure, TuneforgeError):
            return failure
    reason = _load_failure(error)
    if re.match(r"Missing key|[Ss]ize mismatch", reason):
        return TuneforgeError(
            f"{checkpoint}: cannot restore this run from it ({reason}): it holds other weights "
            "(another model, other LoRA targets or ranks, or an older tuneforge that named them "
            "otherwise); restore the settings it was written with, or start a new run in another "
            "run.output_dir"
        )
    return DamagedCheckpointError(checkpoint, reason)


def read_loop_state(checkpoint: Path) -> LoopState:
    values = json.loads((checkpoint / STATE_FILE).read_text())
    values.pop("extra", None)  # an empty field of checkpoints written before `objective`
    return LoopState(**values)


def load_checkpoint(
    checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: Dist
) -> LoopState:
    """Restore weights, optimizer and this rank's RNG (when the checkpoint has this rank)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=OPTIONS)
    parts = accurate_weights(model_state, optimizer_state)
    state = {"model": model_state, "optim": optimizer_state}
    weights = checkpoint / WEIGHTS_DIR
    metadata = read_metadata_file(weights / ".metadata")  # refused or damaged: said at once
    try:
        with _dcp_quiet():
            dcp.load(
                state,
                checkpoint_id=weights,
                storage_reader=SafeReader(weights, metadata),
                planner=SafeLoadPlanner(weights),
            )
    except CheckpointException as error:  # a BaseException, with every rank's traceback in it
        raise _read_failure(checkpoint, error) from None
    split_accurate_weights(model_state, optimizer_state, parts)
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


def load_intact(
    checkpoint: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world: Dist,
    fall_back: bool,
) -> tuple[LoopState, Path]:
    """`load_checkpoint`; with `fall_back` (`--resume auto`), a damaged checkpoint is kept aside
    and the newest intact one before it loaded instead. Returns the state and where it came from."""
    run_dir = checkpoint.parent.parent
    while True:
        try:
            return load_checkpoint(checkpoint, model, optimizer, world), checkpoint
        except DamagedCheckpointError as error:
            if not fall_back:
                raise
            barrier()
            if world.is_main:
                log.warning("%s: kept aside in %s", error, keep_aside(checkpoint))
            barrier()
            fallback, _ = newest_intact(run_dir)
            if fallback is None:
                raise TuneforgeError(
                    f"{error}, and no intact checkpoint precedes it: pass --overwrite to start "
                    "the run again"
                ) from None
            checkpoint = fallback
