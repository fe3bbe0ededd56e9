"""The documentation site's one addition to MkDocs: the benchmark tables (bench/RESULTS.md, kept
beside the benchmark) are a page of the site, and the guides' links to them lead there."""

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "RESULTS.md"
PAGE = "results.md"


def on_files(files, config):
    files.append(File.generated(config, PAGE, abs_src_path=str(RESULTS)))
    return files


def on_page_markdown(markdown, page, config, files):
    # a guide links to ../bench/RESULTS.md (read on GitHub); on the site it is the results page
    return markdown.replace("](../bench/RESULTS.md", f"]({PAGE}")
