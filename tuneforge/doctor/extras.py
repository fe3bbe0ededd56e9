"""Which of tuneforge's optional extras are installed here: each extra's packages as the
installed package's own metadata lists them, with the version found (None: missing)."""

import importlib.metadata

from packaging.requirements import Requirement

LEFT_OUT = ("dev",)
"""Extras for working on tuneforge itself, not for using it."""


def optional_extras(distribution: str = "tuneforge") -> dict[str, dict[str, str | None]]:
    """extra -> {package: installed version or None}, in the order the metadata lists them."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    extras: dict[str, dict[str, str | None]] = {}
    for line in requirements:
        requirement = Requirement(line)
        marker = str(requirement.marker or "")
        if "extra ==" not in marker:
            continue
        extra = marker.split("extra ==")[1].strip().strip("\"'")
        if extra in LEFT_OUT:
            continue
        try:
            version: str | None = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        extras.setdefault(extra, {})[requirement.name] = version
    return extras


def describe_extras(extras: dict[str, dict[str, str | None]]) -> str:
    """`gguf (gguf 0.17.1), plot (matplotlib 3.10.0); not installed: qlora, wandb`."""
    have = [
        f"{extra} ({', '.join(f'{name} {version}' for name, version in packages.items())})"
        for extra, packages in extras.items()
        if all(packages.values())
    ]
    missing = [extra for extra, packages in extras.items() if not all(packages.values())]
    text = ", ".join(have) or "none"
    if missing:
        text += f"; not installed: {', '.join(missing)} (pip install 'tuneforge[NAME]')"
    return text
