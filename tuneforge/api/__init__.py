"""The public API's functions, one module per command: what `tuneforge.X` names, and what the
command line calls."""
