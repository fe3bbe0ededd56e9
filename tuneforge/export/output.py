"""Where an export goes. `--overwrite` replaces only what an export wrote there (a merged model
directory, a GGUF file), never the export's own inputs; the new output is written beside its
place and moved in when complete, so a failed export leaves the previous one whole."""

import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tuneforge.export.sources import ExportError
from tuneforge.file_modes import follow_umask


@dataclass(frozen=True)
class OutputKind:
    what: str
    """What the output is, for messages: "a merged model directory"."""
    foreign: Callable[[Path], str | None]
    """Why an existing `out` is not such an output (None: it is one, or it is empty)."""


MERGED_FILES = re.compile(
    r"config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors"
    r"|model\.safetensors\.index\.json|tokenizer(_config)?\.json|special_tokens_map\.json"
    r"|chat_template\.(jinja|json)|added_tokens\.json|vocab\.json|merges\.txt|tokenizer\.model"
)
"""The files `export merge` writes: a directory of nothing else is one it wrote."""


def _foreign_directory(out: Path) -> str | None:
    if out.is_symlink() or not out.is_dir():
        return "it is not a directory"
    others = sorted(
        entry.name
        for entry in out.iterdir()
        if entry.is_symlink() or not entry.is_file() or not MERGED_FILES.fullmatch(entry.name)
    )
    if others:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        return f"it holds {listed}"
    return None


def _foreign_gguf(out: Path) -> str | None:
    if out.is_symlink() or not out.is_file():
        return "it is a directory" if out.is_dir() else "it is not a regular file"
    with out.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            return "it is not a GGUF file"
    return None


MERGED = OutputKind("a merged model directory", _foreign_directory)
GGUF = OutputKind("a GGUF file", _foreign_gguf)


def check_output(out: Path, overwrite: bool, inputs: Iterable[Path], kind: OutputKind) -> None:
    """Refuse an output that is, or holds, one of the export's inputs, and an existing output
    unless `overwrite` is given and it is recognisably `kind`."""
    target = out.resolve()
    for source in inputs:
        if target == source.resolve() or target in source.resolve().parents:
            raise ExportError(
                f"--out {out} is or holds the export's input {source}: choose another output"
            )
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise ExportError(f"{out} already exists: choose another output or pass --overwrite")
    reason = kind.foreign(out)
    if reason is not None:
        raise ExportError(
            f"--out {out}: --overwrite replaces only {kind.what} an export wrote, and {reason}; "
            "choose another output, or remove it yourself"
        )


def write_atomically(
    out: Path,
    write: Callable[[Path], None],
    overwrite: bool,
    inputs: Iterable[Path],
    kind: OutputKind,
) -> Path:
    """Call `write(partial)` on a temporary path beside `out`, then move it to `out`, the
    previous output (when allowed to be replaced) set aside until then."""
    inputs = tuple(inputs)
    check_output(out, overwrite, inputs, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    partial, previous = workspace / out.name, workspace / "previous"
    try:
        write(partial)
        check_output(out, overwrite, inputs, kind)  # again: something may have appeared there
        if out.exists() or out.is_symlink():
            out.rename(previous)
        if partial.is_dir():
            follow_umask(partial)
        partial.rename(out)
    except BaseException:
        if previous.exists() and not out.exists():
            previous.rename(out)
        raise
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return out
