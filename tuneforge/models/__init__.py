"""Model code: one decoder for the Llama family, attention backends, shapes and HF weight I/O."""
