"""The errors tuneforge raises for its users: each says what is wrong, where, and what to do."""


class TuneforgeError(Exception):
    """An error caused by the user's input or environment, reported without a traceback. Each
    concern subclasses it (`ConfigError`, `DataError`, `CheckpointError`, `AdapterError`, ...);
    anything else that escapes is an internal bug and keeps its traceback."""
