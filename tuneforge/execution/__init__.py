"""How the model's blocks run, applied from outside before any parallel wrapping: compilation
and activation checkpointing per block, host-memory offload of checkpoints, activations and the
embedding, and the whole step captured as one CUDA graph."""
