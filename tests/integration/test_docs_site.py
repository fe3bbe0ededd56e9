"""The documentation site builds with `mkdocs build --strict`: every page in the navigation, every
link found, the API reference generated from the docstrings; and a broken link fails it."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip


def test_the_site_builds_strictly_with_the_api_reference(tmp_path):
    result = build(REPO, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "Fine-tune as the configuration says" in reference  # tuneforge.train's docstring
    assert (tmp_path / "site" / "results" / "index.html").is_file()  # bench/RESULTS.md


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "bench").mkdir()
    shutil.copy(REPO / "bench" / "RESULTS.md", tmp_path / "bench")
    with (tmp_path / "docs" / "index.md").open("a") as index:
        index.write("\n[a page that is not there](no-such-page.md)\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0 and "no-such-page.md" in result.stderr
