"""A model that cannot be built or loaded as asked: an unknown shape or family, a directory that
is no model, an attention backend or dtype that cannot run here."""

from tuneforge.errors import TuneforgeError


class ModelError(TuneforgeError, ValueError):
    """The user's model settings or files; a `ValueError` too, as the Python API promised."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """Neither a model directory nor a catalog shape."""
