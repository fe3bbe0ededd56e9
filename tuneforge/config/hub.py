"""Models, tokenizers and datasets named by Hugging Face hub id (`org/name`) instead of a
directory: resolved through `huggingface_hub`'s own cache to a snapshot directory and the commit
it holds.
With `HF_HUB_OFFLINE` set only the cache is read; otherwise a missing snapshot is downloaded —
its configuration, tokenizer and safetensors files only (never pickled weights), or a dataset's
data files."""

import contextlib
import contextvars
import os
import re
from collections.abc import Iterator
from pathlib import Path

from tuneforge.errors import TuneforgeError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FILES = {
    "model": ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"],
    "dataset": ["*.parquet", "*.jsonl", "*.json", "*.csv", "*.txt", "*.arrow", "README.md"],
}
"""What a snapshot brings: a model's configs, weights, tokenizers and chat templates; a
dataset's data files and the README that maps its subsets and splits to them (no scripts)."""
WEIGHTS = "*.safetensors"
fetch_weights: contextvars.ContextVar[bool] = contextvars.ContextVar("fetch_weights", default=True)
"""Off while a command needs a model's configuration and tokenizer only (`config validate`,
`config show`, `plan`): a missing snapshot then brings no weights."""


@contextlib.contextmanager
def without_weights() -> Iterator[None]:
    """Resolve hub models without downloading their weights (the configuration is enough)."""
    token = fetch_weights.set(False)
    try:
        yield
    finally:
        fetch_weights.reset(token)


class HubName:
    """Marks a field holding a hub id of `repo_type`, resolved into the section's `path`."""

    def __init__(self, repo_type: str) -> None:
        self.repo_type = repo_type


TRUE = {"1", "true", "yes", "on"}


class HubError(TuneforgeError):
    """A hub id that cannot be resolved here: why (`what`) and what to do (`fix`)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}: {fix}")
        self.what, self.fix = what, fix


def looks_like_hub_id(text: str) -> bool:
    return HUB_ID.match(text) is not None and not text.startswith(".")


def offline() -> bool:
    """`HF_HUB_OFFLINE` as set now (huggingface_hub reads it once, when imported)."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE or bool(constants.HF_HUB_OFFLINE)


def resolve_snapshot(
    repo_id: str, revision: str | None = None, repo_type: str = "model"
) -> tuple[Path, str]:
    """(snapshot directory, commit) of a hub model, tokenizer or dataset."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = os.environ.get("HF_HUB_CACHE")
    local_only = offline()
    patterns = [p for p in FILES[repo_type] if fetch_weights.get() or p != WEIGHTS]
    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=local_only,
            allow_patterns=patterns, repo_type=repo_type,
        )  # fmt: skip
    except LocalEntryNotFoundError:
        where = f" at revision {revision}" if revision else ""
        if local_only:
            raise HubError(
                f"{repo_id}{where} is not in the Hugging Face cache ({cache or 'the default'}) "
                "and HF_HUB_OFFLINE is set",
                f"download it where there is a network (hf download {repo_id}"
                f"{' --repo-type dataset' if repo_type == 'dataset' else ''}) into that cache, "
                "or give the path of a local directory",
            ) from None
        raise HubError(
            f"{repo_id}{where} could not be downloaded", "check the network, or give a local path"
        ) from None
    except (RepositoryNotFoundError, GatedRepoError) as error:
        raise HubError(
            f"{repo_id}: the hub refuses it ({type(error).__name__})",
            "check the name, or log in (hf auth login) for a gated model",
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {revision}", "check the revision") from None
    return Path(folder), Path(folder).name
