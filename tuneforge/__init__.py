"""tuneforge: fine-tune large language models, and know before launch whether the run fits.

The public API is what `__all__` names: one function per command (`config`, `train`, `plan`,
`evaluate`, `generate`, `export_merge`, `compare`, `doctor_oom`, ...), the model and adapter
functions, and the types they take and return. Everything else may change between versions."""

import importlib
import inspect
import types
from typing import Any

# `config`, `train` and `plan` are also subpackages; they are imported here (none imports torch)
# so that each is the module and, called, the function of its name
import tuneforge.config
import tuneforge.plan
import tuneforge.train

__version__ = "0.1.0"

_FUNCTIONS = {
    "config": "tuneforge.api.configuration",
    "validate": "tuneforge.api.configuration",
    "train": "tuneforge.api.training",
    "plan": "tuneforge.api.planning",
    "evaluate": "tuneforge.api.evaluation",
    "generate": "tuneforge.api.generation",
    "generate_dataset": "tuneforge.api.generation",
    "export_merge": "tuneforge.api.exporting",
    "export_gguf": "tuneforge.api.exporting",
    "compare": "tuneforge.api.comparing",
    "doctor_oom": "tuneforge.api.doctoring",
    "doctor_log": "tuneforge.api.doctoring",
    "doctor_env": "tuneforge.api.runs_and_data",
    "plot": "tuneforge.api.runs_and_data",
    "inspect_data": "tuneforge.api.runs_and_data",
    "catalog": "tuneforge.api.runs_and_data",
    "slurm_chain": "tuneforge.api.runs_and_data",
    "slurm_submit": "tuneforge.api.runs_and_data",
    "slurm_status": "tuneforge.api.runs_and_data",
    "load_model": "tuneforge.models.api",
    "save_model": "tuneforge.models.api",
    "apply_lora": "tuneforge.peft.apply",
    "merge_lora": "tuneforge.peft.apply",
    "save_adapter": "tuneforge.peft.adapter_io",
    "load_adapter": "tuneforge.peft.adapter_io",
}
_TYPES = {
    "RunConfig": "tuneforge.config.schema",
    "ConfigIssue": "tuneforge.config.errors",
    "TuneforgeError": "tuneforge.errors",
    "ConfigError": "tuneforge.config.errors",
    "DataError": "tuneforge.data.records",
    "RecordError": "tuneforge.data.records",
    "ExportError": "tuneforge.export.sources",
    "AdapterError": "tuneforge.peft.adapter_io",
    "HubError": "tuneforge.config.hub",
    "Validation": "tuneforge.api.configuration",
    "RunStart": "tuneforge.api.run_start",
    "TrainSummary": "tuneforge.train.loop",
    "PlanResult": "tuneforge.api.planning",
    "RunEvaluation": "tuneforge.api.evaluation",
    "Comparison": "tuneforge.api.comparing",
}
__all__ = [*_FUNCTIONS, *_TYPES]


def _public(name: str) -> Any:
    return getattr(importlib.import_module({**_FUNCTIONS, **_TYPES}[name]), name)


class _CallableModule(types.ModuleType):
    """A subpackage that is also the public function of its name: `tuneforge.train(...)`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _public(self.__name__.rpartition(".")[2])(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_public(self.__name__.rpartition(".")[2]))


for _module in (tuneforge.config, tuneforge.train, tuneforge.plan):
    _module.__class__ = _CallableModule


def __getattr__(name: str) -> Any:
    # imported on first use, so that `import tuneforge.data` (and its worker processes) stay
    # free of torch
    if name in _FUNCTIONS or name in _TYPES:
        return _public(name)
    raise AttributeError(f"module 'tuneforge' has no attribute {name!r}")
