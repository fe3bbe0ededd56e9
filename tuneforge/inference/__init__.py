"""A finished run loaded back for generation: its weights, or its base with the adapter."""
