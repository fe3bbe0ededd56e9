"""Optional packages a configuration needs on the machine that runs it (bitsandbytes for a 4-bit
base, torchao for its FP8 training, the trackers' packages, pyarrow and datasets for their data):
found from the configuration alone, before any work, and named with the field that needs each
and the extra that installs it. `config validate` lists them; `train` refuses to start without
them."""

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from tuneforge.config.objectives.registry import declaration_of


@dataclass(frozen=True)
class MissingPackage:
    field: str
    """The configuration field that needs it."""
    module: str
    install: str
    """The command that installs it."""

    def message(self) -> str:
        return f"{self.field} needs the {self.module} package, not installed here: {self.install}"


def installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it."""
    if module in sys.modules:  # imported already, or marked missing (None)
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def extra(name: str) -> str:
    return f"pip install 'tuneforge[{name}]'"


def needed_packages(config: Any) -> list[tuple[str, str, str]]:
    """(field, module, install command) of every optional package `config` (a RunConfig)
    needs."""
    needs = []
    if config.model.quantize:
        needs.append(("model.quantize", "bitsandbytes", extra("qlora")))
    for frozen in declaration_of(config).frozen_models(config):
        if frozen.model is not None and frozen.model.quantize:
            needs.append((f"{frozen.field}.quantize", "bitsandbytes", extra("qlora")))
    if config.precision.fp8 and config.precision.fp8_implementation == "torchao":
        needs.append(("precision.fp8_implementation", "torchao", "pip install torchao"))
    for name, module in (("wandb", "wandb"), ("mlflow", "mlflow")):
        if name in config.logging.report_to:
            needs.append(("logging.report_to", module, extra(name)))
    for split in ("train", "eval"):
        for index, source in enumerate(getattr(config.data, split)):
            where = f"data.{split}.{index}"
            if source.hub is not None:
                needs.append((f"{where}.hub", "datasets", extra("datasets")))
            elif str(source.path or "").endswith(".parquet"):
                needs.append((f"{where}.path", "pyarrow", extra("parquet")))
    return list(dict.fromkeys(needs))


def missing_packages(config: Any) -> list[MissingPackage]:
    return [
        MissingPackage(field, module, install)
        for field, module, install in needed_packages(config)
        if not installed(module)
    ]
