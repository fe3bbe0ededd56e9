"""examples/quickstart.ipynb runs from start to end on the CPU, through the public API alone."""

import json
from pathlib import Path

import nbclient
import nbformat

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_quickstart_notebook_runs_and_uses_only_the_public_api(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    monkeypatch.setenv("QUICKSTART_STEPS", "40")  # the campaign's every call, on short runs
    notebook = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "from tuneforge." not in source and "import tuneforge." not in source
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": EXAMPLES}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    printed = json.dumps([cell.get("outputs", []) for cell in notebook.cells])
    assert "fits: True" in printed and "reward accuracy" in printed
    assert (tmp_path / "quickstart.gguf").is_file()
    assert (tmp_path / "quickstart-merged" / "config.json").is_file()
