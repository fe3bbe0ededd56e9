"""Write an export next to its final place and move it there when complete, so a failed export
leaves nothing behind and an existing output is only replaced when asked."""

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tuneforge.export.sources import ExportError


def write_atomically(out: Path, write: Callable[[Path], None], overwrite: bool) -> Path:
    """Call `write(partial)` on a temporary path beside `out`, then rename it to `out`."""
    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists: choose another output or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    partial = workspace / out.name
    try:
        write(partial)
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        partial.rename(out)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return out
