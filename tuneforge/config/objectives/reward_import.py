"""A reward function of yours, named `module:function`, imported as the run imports it; kept
apart from the rewards' code so that `config validate` checks it without loading torch."""

import importlib
from collections.abc import Callable


def import_reward(path: str, field: str) -> Callable[..., object]:
    """The function `path` names; `ValueError` saying what failed, the field `field` first."""
    module_name, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except ImportError as error:
        raise ValueError(
            f"{field}: cannot import {module_name!r} ({error}); the module must be importable "
            "from where the run starts (its directory on PYTHONPATH)"
        ) from None
    except AttributeError:
        raise ValueError(f"{field}: module {module_name!r} has no {name!r}") from None
    if not callable(function):
        raise ValueError(f"{field}: {path} is not a function")
    return function
