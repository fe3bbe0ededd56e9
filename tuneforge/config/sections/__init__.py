"""The configuration's sections, one module per top-level key."""
