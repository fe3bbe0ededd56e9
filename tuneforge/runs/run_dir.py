"""The run directory: its fixed files, whether a run there finished, where to resume it from,
and the settings a resume may not change silently."""

import contextlib
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuneforge.config import RunConfig, dump_config
from tuneforge.errors import TuneforgeError
from tuneforge.runs.checkpoint_dirs import damage, keep_aside, newest_intact
from tuneforge.runs.files import CONFIG_FILE, RUN_FILES, SET_ASIDE_DIR, STATE_FILE

log = logging.getLogger(__name__)

RUN_SETTINGS = (
    ("train", "max_steps"),
    ("train", "epochs"),
    ("train", "lr"),
    ("train", "min_lr"),
    ("train", "warmup_steps"),
    ("train", "schedule"),
    ("train", "activation_checkpointing"),
    ("train", "checkpoint_every"),
    ("train", "tokens_per_micro_batch"),
    ("train", "loss_chunk_tokens"),
    ("train", "offload_checkpoints"),
    ("train", "offload_activations"),
    ("train", "keep_activations"),
    ("train", "offload_embedding"),
    ("train", "compile_memory_budget"),
    ("data", "max_seq_len"),
    ("model", "dtype"),
    ("precision", "fp8"),
    ("precision", "fp8_base_weights"),
    ("precision", "fp4"),
    ("precision", "fp4_param"),
    ("precision", "master_weights"),
)
"""Settings the schedule or the memory of a run depends on: a resume may not change them
silently."""


def run_settings(config: RunConfig) -> dict[str, Any]:
    return {
        f"{section}.{name}": getattr(getattr(config, section), name)
        for section, name in RUN_SETTINGS
    }


def clear_run(run_dir: Path) -> list[str]:
    """Remove what a run wrote in `run_dir`; returns the names of the other entries, which stay
    (a job's log, the user's notes)."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    return sorted(entry.name for entry in run_dir.iterdir())


def set_aside(run_dir: Path) -> list[str]:
    """Move what a run wrote into `SET_ASIDE_DIR` (emptied of an older one first); returns the
    names of the other entries, which stay."""
    aside = run_dir / SET_ASIDE_DIR
    shutil.rmtree(aside, ignore_errors=True)
    aside.mkdir()
    for name in RUN_FILES:
        path = run_dir / name
        if path.exists() or path.is_symlink():
            path.rename(aside / name)
    return sorted(entry.name for entry in run_dir.iterdir() if entry.name != SET_ASIDE_DIR)


@contextlib.contextmanager
def replacing(run_dir: Path, is_main: bool, replaced: bool, made: bool = False) -> Iterator[None]:
    """Around the new run's setup, where `--overwrite` has just set a run aside (`replaced`):
    should the setup stop (a model that does not load, an interrupt), what it wrote goes and
    the previous run comes back; once it is set up, the previous run is removed. Where the
    setup `made` the run directory, a setup that stops removes it."""
    aside = run_dir / SET_ASIDE_DIR
    if not is_main or not (replaced or made):
        yield
        return
    try:
        yield
    except BaseException:
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
            log.info("%s: the run did not start; its directory is removed", run_dir)
        elif aside.is_dir():
            clear_run(run_dir)
            for entry in aside.iterdir():
                entry.rename(run_dir / entry.name)
            aside.rmdir()
            log.info("%s: the new run did not start; the previous run is back", run_dir)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def changed_settings(saved: dict[str, Any], config: RunConfig) -> list[str]:
    """`key: old -> new` for every setting of `RUN_SETTINGS` that differs from the saved run's
    (a setting the saved run did not record yet is not compared)."""
    return [
        f"{key}: {saved[key]!r} -> {value!r}"
        for key, value in run_settings(config).items()
        if key in saved and saved[key] != value
    ]


def record_changes(run_dir: Path, config: RunConfig, step: int, changed: list[str]) -> None:
    """After a forced resume with `changed` settings: `config.yaml` holds the new configuration,
    headed by comments that say at which steps which settings changed (earlier ones kept)."""
    file = run_dir / CONFIG_FILE
    history = []
    if file.is_file():
        lines = file.read_text(encoding="utf-8").splitlines()
        history = [line for line in lines if line.startswith("# ")]
    history += [f"# resumed at step {step} with {change}" for change in changed]
    file.write_text("\n".join(history) + "\n" + dump_config(config), encoding="utf-8")
    log.warning("resumed at step %d with changed settings: %s", step, "; ".join(changed))


def _make_writable_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".tuneforge-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise TuneforgeError(
            f"run.output_dir: cannot write the run directory {run_dir} "
            f"({error.strerror or error}): set run.output_dir (or run.name) to a writable place"
        ) from None


def check_resume(resume: str, overwrite: bool) -> None:
    """Refuse a `--resume` that is neither `never`, `auto` nor a checkpoint, and one with
    `--overwrite`."""
    if resume not in ("never", "auto") and not (Path(resume) / STATE_FILE).is_file():
        raise TuneforgeError(
            f"--resume {resume}: use never, auto (the newest intact checkpoint) or a checkpoint "
            f"directory (checkpoints/step_N, with its {STATE_FILE})"
        )
    if overwrite and resume != "never":
        raise TuneforgeError("--overwrite and --resume exclude each other: pass one of them")


def prepare_run_dir(
    run_dir: Path,
    resume: str,
    overwrite: bool,
    is_main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> Path | None:
    """The checkpoint to resume from, if any; refuses to touch another run's directory. Every
    rank calls it; the first one (`is_main`) changes the directory between two `barrier`s.
    `resume` and `overwrite` have passed `check_resume` (the trainer checks them when made)."""
    exists = (run_dir / CONFIG_FILE).exists()
    checkpoint: Path | None = None
    damaged: list[tuple[Path, str]] = []
    if resume == "auto":
        checkpoint, damaged = newest_intact(run_dir)
    elif resume != "never":
        checkpoint = Path(resume)
        problem = damage(checkpoint)
        if problem is not None:
            raise TuneforgeError(
                f"--resume {checkpoint}: the checkpoint is damaged ({problem}): resume from an "
                "earlier one, or with --resume auto, which skips damaged checkpoints"
            )
    elif exists and not overwrite:
        raise TuneforgeError(
            f"{run_dir} already holds a run: pass --resume auto to continue it, "
            "--overwrite to replace it, or pick another run.name or run.output_dir"
        )
    barrier()
    if is_main:
        for bad, problem in damaged:
            log.warning(
                "%s is damaged (%s): kept aside in %s; resuming from %s",
                bad,
                problem,
                keep_aside(bad),
                checkpoint or "step 0",
            )
        if exists and overwrite:
            kept = set_aside(run_dir)
            if kept:
                log.info("%s: the previous run set aside; left in place: %s", run_dir, kept)
        if (run_dir / SET_ASIDE_DIR).is_dir() and not overwrite:
            log.warning(
                "%s holds a run set aside by an --overwrite that was killed while it set up: "
                "move the files of %s back to keep it",
                run_dir,
                run_dir / SET_ASIDE_DIR,
            )
        if checkpoint is None and exists and resume == "auto" and not damaged:
            log.info("%s has no complete checkpoint: starting from step 0", run_dir)
        _make_writable_dir(run_dir)
        for partial in (run_dir / "checkpoints").glob(".step_*.partial"):
            shutil.rmtree(partial, ignore_errors=True)  # left by a killed save
    barrier()
    return checkpoint
