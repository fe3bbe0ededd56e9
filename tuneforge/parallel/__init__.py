"""Data parallelism applied to the model from outside: DDP and FSDP2 on the layout
`parallel_dims.ParallelDims` describes."""
