"""Applied to the model from outside: DDP and FSDP2, per-block compilation and activation
checkpointing, host-memory offload, the host embedding and the captured CUDA-graph step."""
