"""`tuneforge models` on an 80-column terminal: every name whole (it is what one copies into
model.name), and small shapes counted in millions, not as 0.00 B."""

from typer.testing import CliRunner

from tuneforge.cli.main import app
from tuneforge.models.catalog import CATALOG


def test_the_catalog_table_fits_80_columns_with_every_name_whole():
    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in result.output  # no column clipped, the headers neither
    assert lines[1].split() == [
        "name",
        "layers",
        "dim",
        "heads/kv",
        "ffn",
        "experts",
        "params",
        "active",
    ]
    names = {line.split()[0] for line in lines if line.strip()}
    assert set(CATALOG) <= names
    demo = next(line for line in lines if line.split() and line.split()[0] == "demo-tiny")
    assert "1.65M" in demo and "0.00" not in demo
    moe = next(line for line in lines if line.split() and line.split()[0] == "qwen3-30b-a3b")
    assert moe.split()[-2:] == ["30.53B", "3.35B"]
