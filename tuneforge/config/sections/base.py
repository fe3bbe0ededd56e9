"""What every configuration section shares: unknown keys are errors, each field's docstring
is its help text (shown by `tuneforge config fields` and in errors). Paths marked `InputPath` are
read by the run, relative ones against the directory of the YAML file that set them."""

import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict


class RelativeToConfigFile:
    """Marks a path field that resolves against the directory of the YAML file setting it; `hub`:
    or names a Hugging Face hub id (`org/name`), resolved through the hub's cache
    (`config/hub.py`)."""

    def __init__(self, hub: bool = False) -> None:
        self.hub = hub


InputPath = Annotated[Path, RelativeToConfigFile()]


ModelPath = Annotated[Path, RelativeToConfigFile(hub=True)]


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A field's docstring, wrapped over lines in the source, is one line of help."""
        super().__pydantic_init_subclass__(**kwargs)
        for field in cls.model_fields.values():
            if field.description:
                field.description = " ".join(field.description.split())


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The config class inside `Section`, `Section | None` or `list[Section]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = section_type(arg)
        if found is not None:
            return found
    return None
